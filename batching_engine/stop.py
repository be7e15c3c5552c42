"""Stop strings: where generated text must end, and how much of it is safe to stream.

A stop string can span tokens, so matching works on the detokenized text, and only the
newest stretch needs searching: a match must end in text that appeared this step.
"""

from __future__ import annotations

from collections.abc import Iterable


def find_stop(text: str, stops: Iterable[str], checked: int = 0) -> int | None:
    """Where the earliest stop string starts in `text`, or None.

    `checked` is how much of `text` an earlier call already searched without a match;
    only matches that end past it are new.
    """
    found: int | None = None
    for stop in stops:
        if not stop:
            continue
        at = text.find(stop, max(0, checked - len(stop) + 1))
        if at != -1 and (found is None or at < found):
            found = at
    return found


def safe_text_end(text: str, stops: Iterable[str]) -> int:
    """How much of `text` can be sent now: none of it may be the start of a stop string.

    A streaming server holds back a tail that could still grow into a stop string, which
    the client must never see.
    """
    end = len(text)
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:size]):
                end = min(end, len(text) - size)
                break
    return end
