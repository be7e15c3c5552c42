"""Fuzzing an HTTP surface that runs as a real process, from its own OpenAPI document.

For each operation with a JSON body, bodies come from three sources: ones its schema allows
(`schema_values`), those with one value replaced by a hostile one (`hostile.mutated`),
and arbitrary JSON or raw bytes. Each is sent over a real connection, and the property is the
one users rely on:
- never a 5xx, and never an answer that hides an internal error behind a 2xx;
- never a hung request (a read timeout is a failure);
- every 4xx names a field, and that field is one the body holds, one its schema requires,
  the one the fuzzer broke, or `body` for the body as a whole.
`CASES` counts what was tried per operation, for the run's summary.
"""

from __future__ import annotations

import http.client
import json
import sys
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infergrid.openapi import operations
from tests.fuzzing.hostile import arbitrary_json, field_root, hostile_strings, mutated, text_mutated
from tests.fuzzing.schema_values import from_schema

CASES: Counter[str] = Counter()
READ_TIMEOUT_S = 60.0
ENCODE_RECURSION_LIMIT = 20_000  # past hostile.deep_nesting's 5,000 levels
MAX_QUERY_CHARS = 3_000  # twice (name=value), within an 8 KiB request line


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    headers: Mapping[str, str]

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError:
            return None


@dataclass(frozen=True)
class Surface:
    """One process's HTTP surface, and how its refusals name a field."""

    name: str
    base_url: str
    document: Mapping[str, Any]
    named_field: Callable[[Answer], str | None]
    headers: Mapping[str, str] = field(default_factory=dict)
    # An answer that is a failure whatever its status (a 200 carrying "internal error").
    hidden_failure: Callable[[Answer], str | None] = lambda answer: None


@dataclass(frozen=True)
class Budget:
    """How many cases per operation, and whether from hypothesis's fixed seed (CI)."""

    examples: int
    fixed_seed: bool = True

    def hypothesis_settings(self) -> settings:
        """The settings of one fuzzed operation or RPC: no example database (a fixed seed
        replays the same cases anyway) and no deadline (a case's time is the server's)."""
        return settings(
            max_examples=self.examples,
            derandomize=self.fixed_seed,
            database=None,
            suppress_health_check=list(HealthCheck),
            deadline=None,
            print_blob=True,
        )


@dataclass(frozen=True)
class Case:
    raw: bytes
    doc: Any = None
    broken: tuple[str | int, ...] | None = None  # the path `mutated` replaced


def send(surface: Surface, method: str, path: str, raw: bytes | None) -> Answer:
    """One request on a fresh connection; a timeout raises, and is the hung-request failure."""
    url = urlsplit(surface.base_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=READ_TIMEOUT_S)
    try:
        headers = {"Content-Type": "application/json", **surface.headers}
        conn.request(method.upper(), path, body=raw, headers=headers)
        response = conn.getresponse()
        return Answer(response.status, response.read(), dict(response.getheaders()))
    finally:
        conn.close()


def encoded(doc: Any) -> bytes:
    """JSON as clients send it: lone surrogates escaped (`\\ud800`), which is valid JSON.
    `deep_nesting` goes past Python's recursion limit, which is raised for this call only."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, ENCODE_RECURSION_LIMIT))
    try:
        return json.dumps(doc, ensure_ascii=True, allow_nan=False).encode()
    finally:
        sys.setrecursionlimit(limit)


def cases(schema: Mapping[str, Any]) -> st.SearchStrategy[Case]:
    valid = from_schema(dict(schema))
    raw_bytes = st.one_of(
        st.binary(max_size=64),
        st.sampled_from(
            (
                b"",
                b"{",
                b"[1,",
                b'{"a":NaN}',
                b'{"a":Infinity}',
                b"\xff\xfe{}",
                b'{"model":"\xed\xa0\x80"}',
                b"null",
                b"\x00",
            )
        ),  # fmt: skip
    )
    return st.one_of(
        valid.map(lambda d: Case(encoded(d), d)),
        mutated(valid).map(lambda m: Case(encoded(m[0]), m[0], m[1])),
        text_mutated(valid).map(lambda m: Case(encoded(m[0]), m[0], m[1] or None)),
        arbitrary_json().map(lambda d: Case(encoded(d), d)),
        raw_bytes.map(lambda raw: Case(raw, _as_read(raw))),
    )


def _as_read(raw: bytes) -> Any:
    """What a server's `json.loads` makes of raw bytes (it passes surrogate bytes through), so
    a refusal may name a key they hold; None where they are not JSON."""
    try:
        return json.loads(raw)
    except ValueError:
        return None


def check(surface: Surface, schema: Mapping[str, Any], case: Case, answer: Answer) -> None:
    where = f"{surface.name}: body {case.raw[:300]!r} got {answer.status} {answer.body[:300]!r}"
    assert answer.status < 500, where
    hidden = surface.hidden_failure(answer)
    assert hidden is None, f"{where}: {hidden}"
    if 400 <= answer.status < 500 and answer.status not in (401, 403, 404, 405, 429):
        named = surface.named_field(answer)
        assert named, f"{where}: the refusal names no field"
        assert named == "body" or _may_name(named, schema, case), f"{where}: names {named!r}"


def _may_name(named: str, schema: Mapping[str, Any], case: Case) -> bool:
    root = field_root(named)
    held = set(case.doc) if isinstance(case.doc, dict) else set()
    required = set(schema.get("required", ()))
    broken = {str(case.broken[0])} if case.broken else set()
    return root in held | required | broken


def fuzz_operation(surface: Surface, method: str, path: str, budget: Budget) -> None:
    """Fuzzes one operation of the surface's document within `budget`."""
    schema = next(s for m, p, s in operations(surface.document) if (m, p) == (method, path))
    key = f"{surface.name} {method.upper()} {path}"

    @budget.hypothesis_settings()
    @given(case=cases(schema or {}) if schema is not None else query_cases())
    def run(case: Case) -> None:
        CASES[key] += 1
        if schema is None:
            answer = send(surface, method, path + case.raw.decode("ascii"), None)
            check(surface, {}, case, answer)
        else:
            check(surface, schema, case, send(surface, method, path, case.raw))

    run()


def query_cases() -> st.SearchStrategy[Case]:
    """Query strings for operations without a body: percent-encoded hostile text, cut to a
    request line every HTTP server reads (aiohttp refuses one past 8190 bytes, in its parser,
    before any route runs, with a 400 that names nothing)."""
    text = hostile_strings(32).map(
        lambda s: quote(s.encode("utf-8", "surrogatepass"), safe="")[:MAX_QUERY_CHARS]
    )
    return st.one_of(st.just(""), text.map(lambda q: f"?{q}={q}")).map(lambda q: Case(q.encode()))
