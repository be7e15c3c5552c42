"""Stop strings: where generated text must end, and how much of it is safe to stream.

A stop string can span tokens, so matching works on the detokenized text, and only the
newest stretch needs searching: a match must end in text that appeared this step, so it
starts at most the longest stop's length before it (`search_from`). The protocol caps a
stop string's length (`MAX_STOP_LENGTH`), so each step's check is bounded by the new text
plus that cap, and a whole output's checks are linear in its length, not quadratic; the
text itself grows a token at a time (`StopWatch`), never re-decoded whole.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final, Protocol

MAX_STOP_LENGTH: Final = 1000  # characters; a longer stop string is a 400 naming it


class TextStream(Protocol):
    """Output text grown a token at a time and never taken back: the tokenizer's
    `IncrementalDetokenizer`, the same the server streams with, so indices agree."""

    text: str

    def push(self, token_id: int) -> str: ...


class StopWatch:
    """One sequence's stop-string search: each check detokenizes only the tokens added since
    the last one and searches only the tail a new match can end in."""

    def __init__(self, stops: Sequence[str], text: TextStream) -> None:
        self._stops, self._text = stops, text
        self._pushed = self._checked = 0

    def check(self, output_ids: Sequence[int]) -> int | None:
        """Where the earliest stop string starts in the output text, or None; `output_ids`
        is the sequence's output so far, which only grows."""
        for token_id in output_ids[self._pushed :]:
            self._text.push(token_id)
        self._pushed = len(output_ids)
        text = self._text.text
        at = find_stop(text, self._stops, self._checked)
        self._checked = len(text)
        return at


def search_from(checked: int, stops: Iterable[str]) -> int:
    """The first index a new match can start at, when `checked` characters were already
    searched without a match: any stop string found afresh must end past `checked`."""
    longest = max((len(stop) for stop in stops), default=0)
    return max(0, checked - longest + 1)


def find_stop(text: str, stops: Sequence[str], checked: int = 0) -> int | None:
    """Where the earliest stop string starts in `text`, or None.

    `checked` is how much of `text` an earlier call already searched without a match;
    only `text[search_from(checked, stops):]` is searched.
    """
    start = search_from(checked, stops)
    window = text[start:]
    found = [at for stop in stops if stop and (at := window.find(stop)) != -1]
    return start + min(found) if found else None


def safe_text_end(text: str, stops: Iterable[str]) -> int:
    """How much of `text` can be sent now: none of it may be the start of a stop string.

    A streaming server holds back a tail that could still grow into a stop string, which
    the client must never see.
    """
    held = max((_held_back(text, stop) for stop in stops if stop), default=0)
    return len(text) - held


def _held_back(text: str, stop: str) -> int:
    """The longest proper prefix of `stop` that `text` ends with, in time linear in
    `len(stop)`: Knuth-Morris-Pratt over the text's last `len(stop) - 1` characters, too
    few to hold the whole stop string."""
    border = _borders(stop)
    matched = 0
    for char in text[max(0, len(text) - len(stop) + 1) :]:
        while matched and stop[matched] != char:
            matched = border[matched - 1]
        matched += stop[matched] == char
    return matched


def _borders(stop: str) -> list[int]:
    """border[i]: the length of the longest proper prefix of stop[: i + 1] that ends it."""
    border = [0] * len(stop)
    for i in range(1, len(stop)):
        k = border[i - 1]
        while k and stop[i] != stop[k]:
            k = border[k - 1]
        border[i] = k + (stop[i] == stop[k])
    return border
