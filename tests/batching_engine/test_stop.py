"""Stop strings: found wherever they end in new text, searched only near it, and never
streamed in part."""

from __future__ import annotations

from hypothesis import assume, given
from hypothesis import strategies as st

from batching_engine.stop import (
    MAX_STOP_LENGTH,
    StopWatch,
    find_stop,
    safe_text_end,
    search_from,
)

texts = st.text(alphabet="ab", max_size=40)
stop_lists = st.lists(st.text(alphabet="ab", min_size=1, max_size=6), min_size=1, max_size=4)


def test_a_stop_string_is_capped_at_a_thousand_characters() -> None:
    assert MAX_STOP_LENGTH == 1000


def test_only_the_new_text_and_the_longest_stop_before_it_are_searched() -> None:
    assert search_from(10_000, ["ab", "x" * 5]) == 10_000 - 4
    assert search_from(10_000, ["x" * MAX_STOP_LENGTH]) == 10_000 - MAX_STOP_LENGTH + 1
    assert search_from(3, ["x" * 5]) == 0


def test_a_match_that_ended_in_text_already_checked_is_not_searched_again() -> None:
    text = "STOP" + "x" * 10_000 + "end"
    assert find_stop(text, ["STOP"], checked=len(text) - 3) is None
    assert find_stop(text, ["STOP", "xend"], checked=len(text) - 3) == len(text) - 4


@given(texts, stop_lists, st.integers(0, 40))
def test_the_earliest_match_is_found_when_the_checked_text_held_none(
    text: str, stops: list[str], checked: int
) -> None:
    checked = min(checked, len(text))
    assume(not any(stop in text[:checked] for stop in stops))
    starts = [i for stop in stops for i in range(len(text)) if text.startswith(stop, i)]
    assert find_stop(text, stops, checked) == min(starts, default=None)


@given(texts, stop_lists)
def test_the_held_back_tail_is_the_longest_that_could_grow_into_a_stop(
    text: str, stops: list[str]
) -> None:
    held = max(
        (size for stop in stops for size in range(1, len(stop)) if text.endswith(stop[:size])),
        default=0,
    )
    assert safe_text_end(text, stops) == len(text) - held


def test_a_long_stop_string_is_held_back_in_linear_time() -> None:
    stop = "a" * (MAX_STOP_LENGTH - 1) + "b"
    assert safe_text_end("x" + "a" * 5000, [stop]) == 5001 - (MAX_STOP_LENGTH - 1)


class CountingText:
    """One letter a token, counting the tokens it is given."""

    def __init__(self) -> None:
        self.text, self.pushed = "", 0

    def push(self, token_id: int) -> str:
        self.pushed += 1
        self.text += chr(ord("a") + token_id)
        return self.text[-1]


def test_a_stop_watch_detokenizes_each_token_once_and_finds_a_stop_across_tokens() -> None:
    text = CountingText()
    watch = StopWatch(["cd"], text)
    output: list[int] = []
    found = []
    for token in [0, 1, 2, 3]:  # a b c d
        output.append(token)
        found.append(watch.check(output))
    assert found == [None, None, None, 2] and text.pushed == 4
