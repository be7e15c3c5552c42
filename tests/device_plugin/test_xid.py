"""Which XIDs take a GPU out until it is reset, which pass, and which are the application's."""

import pytest

from device_plugin.xid import XidKind, classify_xid, describe_xid

TABLE = [
    (13, XidKind.APPLICATION),  # graphics engine exception
    (31, XidKind.APPLICATION),  # memory page fault
    (43, XidKind.APPLICATION),  # GPU stopped processing (the application's context)
    (45, XidKind.APPLICATION),  # preemptive cleanup
    (68, XidKind.APPLICATION),  # video decoder exception
    (109, XidKind.APPLICATION),  # context switch timeout
    (48, XidKind.NEEDS_RESET),  # double-bit ECC
    (63, XidKind.NEEDS_RESET),  # row remapping recorded
    (64, XidKind.NEEDS_RESET),  # row remapping failed
    (74, XidKind.NEEDS_RESET),  # NVLink
    (79, XidKind.NEEDS_RESET),  # fallen off the bus
    (92, XidKind.NEEDS_RESET),  # high single-bit ECC rate
    (94, XidKind.NEEDS_RESET),  # contained ECC
    (95, XidKind.NEEDS_RESET),  # uncontained ECC
    (119, XidKind.NEEDS_RESET),  # GSP RPC timeout
    (120, XidKind.NEEDS_RESET),  # GSP error
    (8, XidKind.TRANSIENT),
    (32, XidKind.TRANSIENT),
    (0, XidKind.TRANSIENT),
    (99999, XidKind.TRANSIENT),  # unknown to this table: transient, never ignored
]


@pytest.mark.parametrize(("xid", "kind"), TABLE)
def test_each_xid_is_classified(xid, kind):
    assert classify_xid(xid) is kind


def test_an_xid_that_needs_a_reset_is_described_by_what_it_means():
    assert describe_xid(48) == "XID 48 (double-bit ECC error)"
    assert describe_xid(32) == "XID 32"
