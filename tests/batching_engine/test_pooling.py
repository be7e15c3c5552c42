"""An embedding model's pooling, read from its sentence-transformers files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from batching_engine.model.pooling import DEFAULT_POOLING, Pooling, read_pooling
from infergrid.errors import ContractError

ST = "sentence_transformers.models."


def write_modules(path: Path, kinds: list[str], pooling: dict | None = None) -> None:
    modules = [
        {"idx": i, "name": str(i), "path": f"{i}_{kind}" if i else "", "type": ST + kind}
        for i, kind in enumerate(kinds)
    ]
    (path / "modules.json").write_text(json.dumps(modules))
    if pooling is not None:
        (path / "1_Pooling").mkdir()
        (path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))


def test_a_model_without_modules_json_is_mean_pooled_and_normalised(tmp_path):
    assert read_pooling(tmp_path) == DEFAULT_POOLING == Pooling("mean", normalize=True)


@pytest.mark.parametrize(
    ("kinds", "flag", "expected"),
    [
        (
            ["Transformer", "Pooling", "Normalize"],
            "pooling_mode_mean_tokens",
            Pooling("mean", True),
        ),
        (["Transformer", "Pooling"], "pooling_mode_mean_tokens", Pooling("mean", False)),
        (["Transformer", "Pooling", "Normalize"], "pooling_mode_cls_token", Pooling("cls", True)),
        (["Transformer", "Pooling"], "pooling_mode_lasttoken", Pooling("last", False)),
    ],
)
def test_the_pooling_module_and_a_following_normalize_are_read(tmp_path, kinds, flag, expected):
    write_modules(tmp_path, kinds, {"pooling_mode_mean_tokens": False, flag: True})
    assert read_pooling(tmp_path) == expected


@pytest.mark.parametrize(
    ("kinds", "pooling", "message"),
    [
        (["Transformer", "Pooling", "Dense", "Normalize"], {}, "^modules.json: modules .*Dense"),
        (["Transformer"], None, "^modules.json: modules Transformer are not supported"),
        (
            ["Transformer", "Pooling"],
            {"pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": True},
            "^1_Pooling/config.json:pooling_mode_max_tokens: this pooling mode is not supported",
        ),
        (
            ["Transformer", "Pooling"],
            {"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": True},
            "^1_Pooling/config.json: exactly one of .* must be true, got 2",
        ),
        (["Transformer", "Pooling"], None, "^1_Pooling/config.json: missing"),
    ],
)
def test_pooling_the_engine_cannot_reproduce_is_refused(tmp_path, kinds, pooling, message):
    write_modules(tmp_path, kinds, pooling)
    with pytest.raises(ContractError, match=message):
        read_pooling(tmp_path)
