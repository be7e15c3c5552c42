"""Preparing and unpreparing claims: the claim read, the decision, the CDI file, the checkpoint.

The gRPC servicer only converts; this is where a claim's steps happen, in an order that a
crash at any point leaves retryable: the CDI file first, the checkpoint after, so a claim in
the checkpoint always has its file, and a file without a checkpoint entry is rewritten by
the kubelet's retry or removed by its unprepare.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final

from dra_driver import cdi
from dra_driver.checkpoint import Checkpoint, GrantedDevice, PreparedClaim
from dra_driver.prepare import ClaimRef, PreparedDevice, PrepareError, prepare_claim, shown
from dra_driver.slices import NodeDevice

log = logging.getLogger(__name__)

ClaimReader = Callable[[str, str], dict | None]
"""(namespace, name) -> the ResourceClaim as the API serves it, None when it does not exist;
raises ApiError when the API server cannot answer."""

_UID: Final = re.compile(r"[0-9a-fA-F][0-9a-fA-F-]{0,63}")
"""A Kubernetes UID (a UUID); it names files, so nothing else is let through."""
_NAMESPACE: Final = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_NAME: Final = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


class ApiError(Exception):
    """The API server could not answer; the message says what was asked and why it failed."""


class ClaimPreparer:
    """Prepares claims against this node's current devices and remembers what it prepared."""

    def __init__(
        self,
        node: str,
        read_claim: ClaimReader,
        devices: Callable[[], Mapping[str, NodeDevice]],
        cdi_dir: Path,
        checkpoint: Checkpoint,
        mps_root: Path | None,
    ) -> None:
        self.node = node
        self.read_claim = read_claim
        self.devices = devices
        self.cdi_dir = cdi_dir
        self.checkpoint = checkpoint
        self.mps_root = mps_root
        self._lock = threading.Lock()

    def prepare(self, ref: ClaimRef) -> PreparedClaim:
        """The claim's devices; the same answer again for a claim already prepared."""
        check_ref(ref)
        with self._lock:
            done = self.checkpoint.get(ref.uid)
            if done is not None and cdi.spec_path(self.cdi_dir, ref.uid).exists():
                return done
            claim = self._read(ref)
            prepared = prepare_claim(ref, claim, self.node, self.devices(), self.mps_root)
            cdi.write_spec(self.cdi_dir, ref.uid, prepared)
            granted = PreparedClaim(ref.namespace, ref.name, tuple(map(_granted, prepared)))
            self.checkpoint.put(ref.uid, granted)
        log.info("prepared %s: %s", ref, ", ".join(d.device for d in prepared) or "no devices")
        return granted

    def unprepare(self, uid: str) -> None:
        """Removes the claim's CDI file and checkpoint entry; a claim never prepared is done."""
        if not _UID.fullmatch(uid):
            return
        with self._lock:
            cdi.remove_spec(self.cdi_dir, uid)
            self.checkpoint.drop(uid)
        log.info("unprepared claim %s", uid)

    def _read(self, ref: ClaimRef) -> dict:
        try:
            claim = self.read_claim(ref.namespace, ref.name)
        except ApiError as err:
            raise PrepareError(f"{ref}: reading it from the API server failed: {err}") from None
        if claim is None:
            raise PrepareError(f"{ref} does not exist in the API server")
        return claim


def check_ref(ref: ClaimRef) -> None:
    """Refuses a claim reference no Kubernetes object can have, before any use of it."""
    if not _UID.fullmatch(ref.uid):
        raise PrepareError(f"claim uid {shown(ref.uid)} is not a Kubernetes UID")
    if not _NAMESPACE.fullmatch(ref.namespace):
        raise PrepareError(f"{ref}: namespace {shown(ref.namespace)} is not a namespace name")
    if not _NAME.fullmatch(ref.name):
        raise PrepareError(f"{ref}: {shown(ref.name)} is not a ResourceClaim name")


def _granted(device: PreparedDevice) -> GrantedDevice:
    return GrantedDevice(
        request_names=device.request_names,
        pool=device.pool,
        device=device.device,
        cdi_ids=(cdi.cdi_id(device.cdi_name),),
        share_id=device.share_id,
    )
