"""What an XID says about a GPU: nothing (the application's fault), a passing fault, or a reset.

Pure: the health tracker asks ``classify_xid`` and acts on the answer. The
lists follow NVIDIA's device plugin (the XIDs it skips as application errors)
and NVIDIA's XID catalog (those whose immediate action is a GPU reset).
"""

from enum import Enum
from typing import Final


class XidKind(Enum):
    """How the plugin treats a GPU after an XID."""

    APPLICATION = "application"
    """The application's fault: the next pod runs fine on the GPU, which stays healthy."""
    TRANSIENT = "transient"
    """A fault that may pass: unhealthy until the quiet period goes by without another."""
    NEEDS_RESET = "needs reset"
    """The GPU is damaged until it is reset: unhealthy until then, however quiet it stays."""


APPLICATION_XIDS: Final = frozenset(
    {
        13,  # graphics engine exception: the application ran an illegal instruction or address
        31,  # GPU memory page fault: the application touched memory it does not own
        43,  # GPU stopped processing: a fault in the application's context, the GPU is fine
        45,  # preemptive cleanup: the driver tore down the context of a process that ended
        68,  # video decoder exception: raised by the stream the application fed NVDEC
        109,  # context switch timeout: usually the application's long-running kernel
    }
)
"""XIDs caused by an application, not the GPU (NVIDIA's device plugin skips the same ones).

NVML reports these through the same critical-XID event as hardware faults, but
the next pod runs fine on the same GPU, so marking it unhealthy would only waste it.
"""

RESET_XIDS: Final = {
    48: "double-bit ECC error",
    63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapping failed",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}
"""XIDs after which the GPU must be reset before it can be trusted, with what they mean.

Memory that lost data, rows waiting to be remapped, a broken NVLink, a GPU
gone from the bus or firmware that stopped answering: none of these heals by
waiting, and a pod placed there would compute on a broken GPU.
"""


def classify_xid(xid: int) -> XidKind:
    """How XID ``xid`` leaves the GPU; an XID in neither list is treated as transient."""
    if xid in APPLICATION_XIDS:
        return XidKind.APPLICATION
    if xid in RESET_XIDS:
        return XidKind.NEEDS_RESET
    return XidKind.TRANSIENT


def describe_xid(xid: int) -> str:
    """``XID 48 (double-bit ECC error)`` for a known XID, ``XID 32`` for another."""
    meaning = RESET_XIDS.get(xid)
    return f"XID {xid} ({meaning})" if meaning else f"XID {xid}"
