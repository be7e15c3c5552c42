"""Hypothesis strategies for what careless users and attackers send: valid JSON at its edges.

Lone UTF-16 surrogates (valid JSON escapes that decode to no text), NULs, right-to-left and
zero-width marks, huge strings, deeply nested arrays, and numbers at the edges of float and
int64. `mutated` puts one of them in place of one value of a body the schema allows, which is
how a fuzzer reaches the readers past the first field; `arbitrary_json` reaches the rest.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

INT64_MAX = (1 << 63) - 1
EDGE_INTEGERS = (
    0, -1, 1, 255, 256, 65535, 65536, (1 << 31) - 1, -(1 << 31), (1 << 32),
    INT64_MAX, INT64_MAX + 1, -(1 << 63), -(1 << 63) - 1, (1 << 64), 10**30, -(10**30),
)  # fmt: skip
EDGE_FLOATS = (
    -0.0, 5e-324, 2.2250738585072014e-308, 1e-7, 0.5, 0.9999999999999999, 1.0000000000000002,
    2.0000000000000004, 1e15, 9007199254740993.0, 1.7976931348623157e308, -1.7976931348623157e308,
)  # fmt: skip
ODD_CHARACTERS = (
    "\ud800", "\udfff", "\udbff\udbff", "\x00", "\u202e", "\u200f", "\u200b", "\ufeff",
    "\ufffd", "\uffff", "\U0010ffff", "\u0301", "e\u0301", "\U0001f469\u200d\U0001f4bb", "\n",
    "\r\n", "\x1b[31m", '"', "\\", "{{", "%s", "${x}", "../", "a\x00b",
)  # fmt: skip


def hostile_strings(max_size: int = 64) -> st.SearchStrategy[str]:
    """Strings mixing ordinary text with the characters that break encoders and tokenizers."""
    any_char = st.characters(codec=None, categories=None)  # surrogates included
    pieces = st.one_of(st.sampled_from(ODD_CHARACTERS), st.text(any_char, max_size=8))
    small = st.lists(pieces, max_size=8).map("".join).filter(lambda s: len(s) <= max_size)
    huge = st.builds(lambda c, n: c * n, st.sampled_from(("a", "\ud800", "\u202e", "\x00")),
                     st.sampled_from((1 << 12, 1 << 16, 1 << 20)))  # fmt: skip
    # A lone odd character by itself a quarter of the time: the cases that broke things
    # (a prompt of one lone surrogate) are found within CI's fixed budget, on every route.
    return st.one_of(st.sampled_from(ODD_CHARACTERS), small, small, huge)


def edge_numbers() -> st.SearchStrategy[int | float]:
    return st.one_of(
        st.sampled_from(EDGE_INTEGERS),
        st.sampled_from(EDGE_FLOATS),
        st.integers(),
        st.floats(allow_nan=False, allow_infinity=False),
    )


def deep_nesting() -> st.SearchStrategy[Any]:
    """Arrays or objects nested past every parser's comfortable depth."""

    def nest(depth: int, as_object: bool) -> Any:
        value: Any = 0
        for _ in range(depth):
            value = {"a": value} if as_object else [value]
        return value

    return st.builds(nest, st.sampled_from((64, 1000, 5000)), st.booleans())


def hostile_values() -> st.SearchStrategy[Any]:
    """One JSON value of any kind, biased to the edges."""
    return st.one_of(
        hostile_strings(),
        hostile_strings(),
        edge_numbers(),
        st.sampled_from((None, True, False, [], {}, [[]], [None], {"": None})),
        st.lists(st.one_of(edge_numbers(), hostile_strings(16)), max_size=4),
        st.lists(st.integers(min_value=0, max_value=INT64_MAX), min_size=1 << 10, max_size=1 << 10),
        deep_nesting(),
    )


def arbitrary_json() -> st.SearchStrategy[Any]:
    """Any JSON document: mostly objects, since every body is one."""
    leaves = st.one_of(st.none(), st.booleans(), edge_numbers(), hostile_strings(16))
    tree = st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4), st.dictionaries(hostile_strings(12), inner, max_size=4)
        ),
        max_leaves=12,
    )
    return st.one_of(st.dictionaries(st.text(max_size=12), tree, max_size=6), tree)


def paths_of(doc: Any, prefix: tuple[str | int, ...] = ()) -> list[tuple[str | int, ...]]:
    """Every value's path in a document, the root's excluded."""
    found: list[tuple[str | int, ...]] = []
    children = (
        doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    )
    for key, value in children:
        found.append((*prefix, key))
        found.extend(paths_of(value, (*prefix, key)))
    return found


def replaced(doc: Any, path: tuple[str | int, ...], value: Any) -> Any:
    """A copy of `doc` with the value at `path` replaced."""
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(doc, dict):
        return {**doc, head: replaced(doc[head], rest, value)}
    copy = list(doc)
    copy[head] = replaced(doc[head], rest, value)  # type: ignore[index]
    return copy


@st.composite
def mutated(draw: st.DrawFn, valid: st.SearchStrategy[Any]) -> tuple[Any, tuple[str | int, ...]]:
    """A valid body with one value (or one new key) replaced by a hostile one, and its path."""
    doc = draw(valid)
    paths = paths_of(doc)
    if isinstance(doc, dict) and (not paths or draw(st.integers(0, 4)) == 0):
        key = draw(st.sampled_from(sorted(doc) or ["model"]) | hostile_strings(12))
        return {**doc, key: draw(hostile_values())}, (key,)
    if not paths:
        return draw(hostile_values()), ()
    path = draw(st.sampled_from(paths))
    return replaced(doc, path, draw(hostile_values())), path


@st.composite
def text_mutated(
    draw: st.DrawFn, valid: st.SearchStrategy[Any]
) -> tuple[Any, tuple[str | int, ...]]:
    """A valid body with one of its texts made hostile (a prompt, a message, a stop string):
    `mutated` picks any value, so a nested text is rarely the one, and 600 of its cases missed
    the engine's lone-surrogate 500 that this finds within its first hundred."""
    doc = draw(valid)
    texts = [p for p in paths_of(doc) if isinstance(_value_at(doc, p), str)]
    if not texts:
        return doc, ()
    path = draw(st.sampled_from(texts))
    return replaced(doc, path, draw(hostile_strings())), path


def _value_at(doc: Any, path: tuple[str | int, ...]) -> Any:
    for key in path:
        doc = doc[key]
    return doc


def field_root(name: str) -> str:
    """`messages[2].content` -> `messages`: the body's top-level key a field path starts at."""
    for cut in ("[", "."):
        name = name.split(cut, 1)[0]
    return name
