"""The text a client sees of one request's output tokens, as it streams.

Two rules make streamed text final: a character is sent only once its bytes are whole (the
incremental detokenizer's job), and with stop strings, a tail that could still grow into a
stop string is held back until the next token settles it. A whole stop string in new text
ends the request in the same step, so it reaches `finish`, never `push`; `finish` cuts the
text where the engine found it (`Sequence.text_end`), so, as with OpenAI, the stop string
itself is never sent.

The engine finds stop strings in the text of its own incremental detokenizer (`StopWatch`);
the one here is the same kind and starts from no context too, so the two texts agree and
`text_end` indexes both.
"""

from __future__ import annotations

from batching_engine.stop import safe_text_end
from batching_engine.tokenizer import Tokenizer


class TextOutput:
    def __init__(self, tokenizer: Tokenizer, stop: tuple[str, ...] = ()) -> None:
        self._detokenizer = tokenizer.detokenizer()
        self._stop = stop
        self._sent = 0
        self.text = ""  # everything sent so far

    def push(self, token_ids: list[int]) -> str:
        """The new text that is safe to send now (possibly empty); not for the last tokens,
        which may hold a whole stop string: those go to `finish`."""
        self._add(token_ids)
        text = self._detokenizer.text
        return self._send_up_to(safe_text_end(text, self._stop) if self._stop else len(text))

    def finish(self, token_ids: list[int], text_end: int | None) -> str:
        """The rest of the text, cut at `text_end` when a stop string ended the output."""
        self._add(token_ids)
        self._detokenizer.flush()
        end = len(self._detokenizer.text)
        return self._send_up_to(end if text_end is None else min(end, text_end))

    def _add(self, token_ids: list[int]) -> None:
        for token_id in token_ids:
            self._detokenizer.push(token_id)

    def _send_up_to(self, end: int) -> str:
        if end <= self._sent:
            return ""
        delta = self._detokenizer.text[self._sent : end]
        self._sent = end
        self.text += delta
        return delta
