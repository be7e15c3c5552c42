"""Model directories derived from one file (a GGUF converted, a zip extracted), made once.

The directory is named by the file's SHA-256 under the engine's cache, so the work runs the
first time a file is seen and never again. It is built in a temporary directory and renamed
into place, so a crash or a second process building the same file never leaves, or shows,
half a model.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

CACHE_ENV = "INFERGRID_CACHE_DIR"


def default_cache_root() -> Path:
    base = os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "infergrid"
    return Path(base) / "gguf"


def file_sha256(path: Path) -> str:
    with path.open("rb") as stream:
        return hashlib.file_digest(stream, "sha256").hexdigest()


def derived_dir(
    source: Path, build: Callable[[Path], None], cache_root: str | Path | None = None
) -> Path:
    """The model directory `build` writes for `source`, built now if it is not cached yet."""
    root = Path(cache_root) if cache_root is not None else default_cache_root()
    target = root / file_sha256(source)
    if (target / "config.json").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".building-", dir=root))
    try:
        build(staging)
        os.rename(staging, target)
    except OSError:
        if not (target / "config.json").is_file():  # not a lost race with another builder
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
