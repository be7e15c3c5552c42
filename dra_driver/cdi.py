"""CDI specs of prepared claims: one file per claim in the CDI folder containerd reads.

containerd resolves a container's ``infergrid.io/gpu=<claim uid>-<n>`` through these files
when the container is created, so a file must be whole whenever it exists: it is written
beside its place and renamed over it.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from dra_driver.prepare import PreparedDevice
from infergrid import dra
from infergrid.share_edits import Mount

CDI_VERSION: Final = "0.6.0"
"""A version every CDI library containerd 2.x links accepts; env and mounts need only 0.3."""


def cdi_id(name: str) -> str:
    """The fully qualified CDI device name the kubelet hands to the runtime."""
    return f"{dra.CDI_VENDOR_CLASS}={name}"


def spec_path(cdi_dir: Path, claim_uid: str) -> Path:
    """``<cdiDir>/infergrid.io-gpu_<claim uid>.json``: vendor, class and claim, as CDI names."""
    return cdi_dir / f"{dra.CDI_VENDOR_CLASS.replace('/', '-')}_{claim_uid}.json"


def claim_spec(devices: Sequence[PreparedDevice]) -> dict[str, Any]:
    """The CDI spec of one claim's devices."""
    return {
        "cdiVersion": CDI_VERSION,
        "kind": dra.CDI_VENDOR_CLASS,
        "devices": [
            {
                "name": d.cdi_name,
                "containerEdits": {
                    "env": [f"{k}={v}" for k, v in sorted(d.envs.items())],
                    "mounts": [_mount(m) for m in d.mounts],
                },
            }
            for d in devices
        ],
    }


def _mount(mount: Mount) -> dict[str, Any]:
    return {
        "hostPath": mount.host_path,
        "containerPath": mount.container_path,
        "type": "bind",
        "options": ["rbind", "ro" if mount.read_only else "rw"],
    }


def write_atomically(path: Path, text: str) -> None:
    """``text`` at ``path``, never half written: a temporary file beside it, synced, renamed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_spec(cdi_dir: Path, claim_uid: str, devices: Sequence[PreparedDevice]) -> Path:
    path = spec_path(cdi_dir, claim_uid)
    write_atomically(path, json.dumps(claim_spec(devices), indent=2) + "\n")
    return path


def remove_spec(cdi_dir: Path, claim_uid: str) -> None:
    spec_path(cdi_dir, claim_uid).unlink(missing_ok=True)
