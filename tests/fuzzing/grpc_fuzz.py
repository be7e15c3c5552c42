"""Fuzzing a gRPC surface: request bytes drawn from a message's descriptor, and raw bytes.

Messages are written on the wire here, field by field from the descriptor, rather than built
with the generated classes: that is how a request can carry what no well-behaved client
sends and the classes refuse to build: a string field holding invalid UTF-8 (a lone
surrogate as CESU bytes), an int32 past its range, a field repeated thousands of times, a
nested message that is not one, and unknown fields of every wire type. They go out through a
generic unary call with identity serializers. The property is the one the kubelet relies on:
- every call ends with a status: OK, or an error code with a message saying why, and one
  that arrives (a client drops trailers past its metadata limit, and sees RESOURCE_EXHAUSTED);
- never an exception the servicer did not catch (UNKNOWN "Exception calling application"),
  and never a hung call (the deadline passing is a failure);
- the server still answers afterwards (checked by the caller).
Undecodable bytes are refused by grpcio itself, before any servicer runs, with INTERNAL
"Exception deserializing request!": a status with a message, so it passes.
`http_fuzz.CASES` counts what was tried per RPC, for the run's summary.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import grpc
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzzing.hostile import EDGE_INTEGERS, hostile_strings
from tests.fuzzing.http_fuzz import CASES, Budget

DEADLINE_S = 20.0
MAX_DEPTH = 4
MAX_FIELD_BYTES = 1 << 22  # past gRPC's 4 MiB default, short of a memory hog
UNDECODABLE = "Exception deserializing request!"  # grpcio's own refusal of bad bytes
LOST_REASON = "metadata size exceeds"  # the client dropped a status too large for its limit

TRUNCATED = (  # a length past the end, a varint that never ends, an overlong varint
    b"\x0a", b"\x0a\xff\xff\xff\xff\x0f", b"\xff" * 11, b"\x08" + b"\x80" * 10 + b"\x01",
)  # fmt: skip
_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5
_VARINT_TYPES = {
    FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT32,
    FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_BOOL, FieldDescriptor.TYPE_ENUM,
}  # fmt: skip


def varint(value: int) -> bytes:
    """A varint as protobuf writes it: a negative number as its 64-bit two's complement."""
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def key(number: int, wire: int) -> bytes:
    return varint(number << 3 | wire)


def length_delimited(number: int, payload: bytes) -> bytes:
    return key(number, _LENGTH) + varint(len(payload)) + payload


def text_bytes(words: st.SearchStrategy[str]) -> st.SearchStrategy[bytes]:
    """A string field's bytes: mostly the given words, and hostile text as it may arrive on
    the wire (lone surrogates as CESU-8, which is not UTF-8), and raw bytes."""
    wire = words.map(_cesu)
    return st.one_of(wire, wire, hostile_strings(48).map(_cesu), st.binary(max_size=16))


def _cesu(text: str) -> bytes:
    """UTF-8, except that a lone surrogate is written as its three bytes, as CESU-8 does."""
    return text.encode("utf-8", "surrogatepass")


def integers() -> st.SearchStrategy[int]:
    return st.one_of(
        st.sampled_from(EDGE_INTEGERS).map(lambda n: n & ((1 << 64) - 1)),
        st.integers(-3, 16),
        st.integers(0, (1 << 64) - 1),
    )


def unknown_field() -> st.SearchStrategy[bytes]:
    """A field number the message does not define, with a payload of any wire type."""
    number = st.integers(16, (1 << 29) - 1)
    return st.one_of(
        st.builds(lambda n, v: key(n, _VARINT) + varint(v), number, integers()),
        st.builds(lambda n, b: key(n, _FIXED64) + b, number, st.binary(min_size=8, max_size=8)),
        st.builds(lambda n, b: key(n, _FIXED32) + b, number, st.binary(min_size=4, max_size=4)),
        st.builds(length_delimited, number, st.binary(max_size=32)),
    )


@st.composite
def message_bytes(
    draw: st.DrawFn, descriptor: Descriptor, words: st.SearchStrategy[str], depth: int = 0
) -> bytes:
    """One message of `descriptor`'s type on the wire, its string fields drawn from `words`."""
    parts: list[bytes] = []
    for fd in descriptor.fields:
        repeated = fd.is_repeated
        count = draw(_counts() if repeated else st.integers(0, 1))
        if count == 0:
            continue
        value = draw(_field(fd, words, depth))
        if repeated and count > 16:  # a huge count: one value many times (duplicates)
            parts.append(value * max(1, min(count, MAX_FIELD_BYTES // max(len(value), 1))))
        else:
            parts.append(value)
            parts.extend(draw(_field(fd, words, depth)) for _ in range(count - 1))
    parts.extend(draw(st.lists(unknown_field(), max_size=2)))
    order = draw(st.permutations(range(len(parts)))) if len(parts) > 1 else range(len(parts))
    return b"".join(parts[i] for i in order)


def _counts() -> st.SearchStrategy[int]:
    return st.one_of(st.integers(0, 4), st.integers(0, 4), st.sampled_from((64, 10_000)))


def _field(fd: FieldDescriptor, words: st.SearchStrategy[str], depth: int):
    if fd.type == FieldDescriptor.TYPE_MESSAGE:
        if depth >= MAX_DEPTH:
            return st.just(length_delimited(fd.number, b""))
        inner = message_bytes(fd.message_type, words, depth + 1)
        return inner.map(lambda b: length_delimited(fd.number, b))
    if fd.type in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES):
        return text_bytes(words).map(lambda b: length_delimited(fd.number, b))
    if fd.type in _VARINT_TYPES:
        return integers().map(lambda n: key(fd.number, _VARINT) + varint(n))
    raise ValueError(f"field type the fuzzer cannot write: {fd.full_name} ({fd.type})")


@dataclass(frozen=True)
class Rpc:
    """One unary RPC of a service: its method path and its request message."""

    service: str
    name: str
    request: Descriptor

    @property
    def path(self) -> str:
        return f"/{self.service}/{self.name}"


def requests(rpc: Rpc, words: st.SearchStrategy[str]) -> st.SearchStrategy[bytes]:
    """Request bytes: messages from the descriptor, and raw bytes of any kind."""
    raw = st.one_of(
        st.binary(max_size=64),
        st.sampled_from(TRUNCATED),
    )
    message = message_bytes(rpc.request, words)
    return st.one_of(message, message, message, raw)


def call(channel: grpc.Channel, rpc: Rpc, request: bytes) -> tuple[grpc.StatusCode, str, bytes]:
    """The status, its message, and the answer's bytes (empty unless OK)."""
    unary = channel.unary_unary(rpc.path)  # no serializers: bytes in, bytes out
    try:
        return grpc.StatusCode.OK, "", unary(request, timeout=DEADLINE_S)
    except grpc.RpcError as err:
        return err.code(), err.details() or "", b""


def check(rpc: Rpc, request: bytes, code: grpc.StatusCode, details: str) -> None:
    where = f"{rpc.path}: request {request[:200]!r} got {code.name} {details[:300]!r}"
    assert code != grpc.StatusCode.DEADLINE_EXCEEDED, f"{where}: the call hung"
    assert code != grpc.StatusCode.UNKNOWN, f"{where}: the servicer raised"
    assert code != grpc.StatusCode.INTERNAL or details == UNDECODABLE, where
    assert code == grpc.StatusCode.OK or details, f"{where}: an error with no message"
    assert LOST_REASON not in details, f"{where}: the reason was too large to arrive"


def fuzz_rpc(
    channel_for: Callable[[st.DrawFn], grpc.Channel],
    rpc: Rpc,
    words: st.SearchStrategy[str],
    budget: Budget,
    decode: Callable[[bytes], object],
    label: str,
) -> None:
    """Fuzzes one RPC within `budget`; `channel_for` picks the server (say, one per resource)
    for each case, and `decode` must read every OK answer."""
    key_name = f"{label} {rpc.name}"

    @budget.hypothesis_settings()
    @given(data=st.data(), request=requests(rpc, words))
    def run(data: st.DataObject, request: bytes) -> None:
        CASES[key_name] += 1
        code, details, answer = call(channel_for(data.draw), rpc, request)
        check(rpc, request, code, details)
        if code == grpc.StatusCode.OK:
            decode(answer)

    run()
