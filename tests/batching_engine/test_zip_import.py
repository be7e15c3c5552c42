"""Zipped model directories: located cheaply, extracted once per file, atomically."""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

import pytest

from batching_engine.model import zip_import
from batching_engine.model.derived_cache import CACHE_ENV, file_sha256
from batching_engine.model.zip_import import import_zip
from batching_engine.model_source import default_model_name, locate, resolve_model_dir
from infergrid.errors import ContractError

FILES = {"config.json": '{"model_type": "bert"}', "1_Pooling/config.json": "{}"}


def write_zip(path: Path, files: dict[str, str] = FILES) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return path


def test_a_zip_is_extracted_once_into_a_directory_named_by_its_hash(tmp_path):
    archive = write_zip(tmp_path / "model.zip")
    cache = tmp_path / "cache"
    extracted = import_zip(archive, cache)
    assert extracted == cache / file_sha256(archive)
    assert (extracted / "1_Pooling" / "config.json").read_text() == "{}"
    written = (extracted / "config.json").stat().st_mtime_ns
    assert import_zip(archive, cache) == extracted
    assert (extracted / "config.json").stat().st_mtime_ns == written
    assert [p.name for p in cache.iterdir()] == [extracted.name]  # no staging left behind


def test_a_lost_race_returns_the_winners_directory(tmp_path, monkeypatch):
    archive = write_zip(tmp_path / "model.zip")
    cache = tmp_path / "cache"
    real_extract = zip_import.extract_model_zip

    def extract_while_another_process_finishes(zip_path: Path, out_dir: Path, field: str) -> None:
        real_extract(zip_path, cache / file_sha256(zip_path), field)  # the other process, first
        real_extract(zip_path, out_dir, field)

    monkeypatch.setattr(zip_import, "extract_model_zip", extract_while_another_process_finishes)
    extracted = import_zip(archive, cache)
    assert (extracted / "config.json").is_file()
    assert [p.name for p in cache.iterdir()] == [extracted.name]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ({"model/config.json": "{}"}, "has no config.json at its root"),
        (None, "is not a zip file"),
    ],
)
def test_a_zip_that_is_no_model_is_refused_naming_the_uri(tmp_path, content, message):
    archive = tmp_path / "model.zip"
    if content is None:
        archive.write_text("not a zip")
    else:
        write_zip(archive, content)
    with pytest.raises(ContractError, match=message) as err:
        import_zip(archive, tmp_path / "cache", field="--model")
    assert err.value.field == "--model"
    assert list((tmp_path / "cache").iterdir()) == []


def test_locate_finds_a_zip_without_extracting_it_and_resolve_extracts(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    archive = write_zip(tmp_path / "encoder.zip")
    assert locate(f"file://{archive}") == archive
    assert not (tmp_path / "cache").exists()
    assert (resolve_model_dir(str(archive)) / "config.json").is_file()


def test_the_packaged_minilm_is_found_without_importing_its_package():
    path = locate("pkg://all-minilm-l6-v2")
    assert path.name == "model.zip" and path.is_file()
    assert "all_minilm_l6_v2" not in sys.modules
    assert default_model_name("pkg://all-minilm-l6-v2") == "all-minilm-l6-v2"
