"""What an engine reports it spent on a request, read from its answer as the answer passes.

A whole (non-streamed) answer ends with its `usage` object, after every choice, so the usage
is read from the answer's last bytes and the gateway never holds or parses a large answer
whole. A stream reports its usage in one last chunk, with no choices, when the request
asked for `stream_options.include_usage`; the gateway asks for it on every stream it
forwards (`request_body.asking_for_usage`) and keeps that chunk from a client that did not
ask for it, so the client sees the stream it asked for.
"""

from __future__ import annotations

import re
from collections import deque
from typing import Final

import orjson

TAIL_BYTES: Final = 64 << 10  # an answer's last bytes kept for its usage
EVENT_BYTES: Final = 64 << 10  # a usage chunk is far smaller; a longer event passes unread
_TOTAL = re.compile(rb'"total_tokens"\s*:\s*(\d{1,15})[\s,}]')


def total_tokens(usage: object) -> int | None:
    total = usage.get("total_tokens") if isinstance(usage, dict) else None
    return total if isinstance(total, int) and not isinstance(total, bool) else None


def usage_in_tail(tail: bytes) -> int | None:
    """`usage.total_tokens` of a JSON answer whose last bytes are `tail`: after the last
    `"usage"` key, which only the answer's own object can hold (in a string, a quote is
    escaped)."""
    start = tail.rfind(b'"usage"')
    found = _TOTAL.search(tail, start) if start >= 0 else None
    return int(found.group(1)) if found else None


class Tail:
    """The last `limit` bytes of what passed through, kept in the chunks that brought them."""

    def __init__(self, limit: int = TAIL_BYTES) -> None:
        self.limit, self.size = limit, 0
        self.chunks: deque[bytes] = deque()

    def add(self, chunk: bytes) -> None:
        self.chunks.append(chunk)
        self.size += len(chunk)
        while self.chunks and self.size - len(self.chunks[0]) >= self.limit:
            self.size -= len(self.chunks.popleft())

    def bytes(self) -> bytes:
        return b"".join(self.chunks)[-self.limit :]


class StreamUsage:
    """Server-sent events as they pass: `feed` returns the bytes to send on (the client's
    stream, less the usage chunk when `hide`), and `used` the usage reported so far."""

    def __init__(self, hide: bool) -> None:
        self.hide = hide
        self.used: int | None = None
        self._partial = b""

    def feed(self, chunk: bytes) -> bytes:
        data = self._partial + chunk
        end = data.rfind(b"\n\n")
        if end < 0:
            if len(data) > EVENT_BYTES:  # no usage chunk is this long: send it on unread
                self._partial = b""
                return data
            self._partial = data
            return b""
        self._partial = data[end + 2 :]
        events = data[: end + 2]
        if b'"usage"' not in events:
            return events
        return b"".join(e + b"\n\n" for e in events[:-2].split(b"\n\n") if self._keep(e))

    def rest(self) -> bytes:
        """What remains of an unfinished last event, sent on as it is."""
        rest, self._partial = self._partial, b""
        return rest

    def _keep(self, event: bytes) -> bool:
        if not event.startswith(b"data: ") or b'"usage"' not in event or len(event) > EVENT_BYTES:
            return True
        try:
            doc = orjson.loads(event[6:])
        except orjson.JSONDecodeError:
            return True
        if not isinstance(doc, dict) or doc.get("choices") != []:
            return True
        if (used := total_tokens(doc.get("usage"))) is not None:
            self.used = used
        return not self.hide
