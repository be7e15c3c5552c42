"""The serving file: one table of the engine's settings, and its encoder and decoder."""

from __future__ import annotations

from dataclasses import fields

import pytest

from batching_engine.config import EngineConfig
from batching_engine.main import parser
from infergrid.errors import ContractError
from infergrid.serving_config import (
    CRD_SETTINGS,
    ENGINE_SETTINGS,
    ModelRef,
    ServingFile,
    decode,
    encode,
    read_crd_engine,
)

MODEL = ModelRef("m", "pkg://llm-tiny", "gguf", "embedding")


def test_every_batching_setting_of_the_engine_is_in_the_table_with_its_default():
    """So each one is either in the CRD (in_crd) or deliberately engine-only."""
    table = {s.attr: s.default for s in ENGINE_SETTINGS}
    assert {f.name: f.default for f in fields(EngineConfig)} == table


def test_keys_attributes_and_flags_are_unique():
    for name in ("key", "attr", "flag"):
        values = [getattr(s, name) for s in ENGINE_SETTINGS]
        assert len(set(values)) == len(values), name


def test_every_default_passes_its_own_check():
    for setting in ENGINE_SETTINGS:
        assert setting.check(setting.default, setting.key) == setting.default


def test_every_setting_is_a_flag_of_the_engine():
    flags = {a for action in parser()._actions for a in action.option_strings}
    assert {s.flag for s in ENGINE_SETTINGS} <= flags


def test_an_empty_spec_engine_gets_every_crd_default_in_the_crds_order():
    engine = read_crd_engine({}, "spec.engine")
    assert engine == {s.key: s.default for s in CRD_SETTINGS}
    assert list(engine) == [s.key for s in CRD_SETTINGS]


def test_a_bad_spec_engine_value_is_named_by_its_path():
    with pytest.raises(ContractError) as caught:
        read_crd_engine({"blockSize": 12}, "spec.engine")
    assert caught.value.field == "spec.engine.blockSize"


def test_what_is_encoded_decodes_to_the_same_model_port_and_settings():
    engine = read_crd_engine({"maxNumSeqs": 8}, "spec.engine")
    served = decode(encode(MODEL, engine, 9000))
    by_attr = {s.attr: engine[s.key] for s in CRD_SETTINGS}
    assert served == ServingFile(MODEL, by_attr, 9000)


def test_the_file_carries_the_schema_version_and_model_in_the_files_spelling():
    doc = encode(MODEL, {})
    assert doc == {
        "version": "v1",
        "port": 8000,
        "model": {"name": "m", "storageUri": "pkg://llm-tiny", "format": "gguf",
                  "task": "embedding"},
        "engine": {},
    }  # fmt: skip


def test_decode_keeps_only_what_the_file_sets_and_ignores_the_operators_image():
    served = decode({**encode(MODEL, {}), "engine": {"image": "x", "priorityLevels": 3}})
    assert served.engine == {"priority_levels": 3}
