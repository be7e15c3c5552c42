"""Who may call, and how much: API keys mapped to tenants, each with its limits.

The keys live in a Secret the operator of the gateway writes, under the data key
`tenants.yaml`:

    version: v1
    tenants:
      - name: team-a
        keys: [sk-team-a-1]          # what clients send as `Authorization: Bearer <key>`,
                                     # or sha256:<64 hex digits> of it, so the Secret
                                     # holds no key a reader of it could use
        requestsPerSecond: 5         # token bucket of requests: refill rate...
        burst: 10                    # ...and size (default: requestsPerSecond, at least 1)
        tokensPerMinute: 20000       # token bucket of model tokens (default: no limit)
        maxConcurrent: 8             # requests in flight at once (default: no limit)
        namespaces: [team-a]         # whose InferenceServices it may call (default: all)
        maxScaleFromZero: 2          # services its requests may wake from zero replicas at
                                     # once (default 2); past it, a 429 names the limit

A tenant's model names resolve only inside its namespaces (`model_names.py`): `team-b/chat`
names team-b's model, and a bare `chat` the one namespace of its own that serves it.

Without a keys Secret the gateway refuses to start unless `allowAnonymous` is set; then every
caller is the one `anonymous` tenant, whose limits are the gateway's `anonymous*` settings
(`config.py`), all finite by default, so an open gateway is still a bounded one.

Parsing is strict (every refusal names its field) so a typo cannot silently lift a limit.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import yaml

from infergrid.codec import (
    check_version,
    each,
    expect,
    field,
    integer,
    join,
    reject_unknown,
    unique,
)
from infergrid.errors import ContractError

SECRET_KEY: Final = "tenants.yaml"
MAX_TENANTS: Final = 10_000
MIN_KEY_CHARS: Final = 16  # a key short enough to guess is refused
TENANT_FIELDS: Final = (
    "name", "keys", "requestsPerSecond", "burst", "tokensPerMinute", "maxConcurrent",
    "namespaces", "maxScaleFromZero",
)  # fmt: skip
ANONYMOUS: Final = "anonymous"  # the tenant of every request when no keys are configured
SCALE_FROM_ZERO: Final = 2  # services a tenant may wake at once, unless it says otherwise
HASHED: Final = "sha256:"
_HEX_DIGEST: Final = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True, slots=True)
class TenantLimits:
    name: str
    requests_per_s: float = math.inf
    burst: float = math.inf
    tokens_per_minute: float = math.inf
    max_concurrent: int | None = None
    namespaces: frozenset[str] | None = None  # None: every namespace the gateway serves
    max_scale_from_zero: int = SCALE_FROM_ZERO  # services woken from zero at once

    def may_call(self, namespace: str) -> bool:
        return self.namespaces is None or namespace in self.namespaces


@dataclass(frozen=True, slots=True)
class KeyTable:
    """API key -> tenant, held by the keys' SHA-256 digests: a lookup's timing depends on a
    digest, which tells a guesser nothing about how close a guess came to a key."""

    digests: Mapping[bytes, TenantLimits]

    @classmethod
    def of(cls, keys: Mapping[str, TenantLimits]) -> KeyTable:
        return cls({_digest(k): t for k, t in keys.items()})

    def tenant(self, key: str) -> TenantLimits | None:
        return self.digests.get(_digest(key))

    def tenants(self) -> list[TenantLimits]:
        return list({t.name: t for t in self.digests.values()}.values())


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


def parse_tenants(text: str, path: str = SECRET_KEY) -> KeyTable:
    """The key table of a `tenants.yaml` document; ContractError names the bad field."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ContractError(path, f"not valid YAML: {err}") from None
    doc = expect(doc, dict, path)
    reject_unknown(doc, ("version", "tenants"), path)
    check_version(doc)
    entries = each(doc, "tenants", dict, path)
    if len(entries) > MAX_TENANTS:
        raise ContractError(join(path, "tenants"), f"at most {MAX_TENANTS} tenants")
    tenants = [(_tenant(entry, where), where, entry) for entry, where in entries]
    unique(((t.name, join(w, "name")) for t, w, _ in tenants), "tenant name")
    keyed = [(digest, kpath, t) for t, w, e in tenants for digest, kpath in _keys(e, w)]
    # Named by digest: an error must not print a key, and a key listed both plainly and
    # hashed is the same key.
    unique(((HASHED + d.hex(), p) for d, p, _ in keyed), "API key")
    return KeyTable({digest: tenant for digest, _, tenant in keyed})


def _tenant(doc: dict[str, Any], path: str) -> TenantLimits:
    reject_unknown(doc, TENANT_FIELDS, path)
    rate = _positive(doc, "requestsPerSecond", path)
    burst = _positive(doc, "burst", path)
    if burst is None:
        burst = math.inf if rate is None else max(rate, 1.0)
    concurrent = None
    if doc.get("maxConcurrent") is not None:
        concurrent = integer(doc, "maxConcurrent", path, low=1)
    tokens = _positive(doc, "tokensPerMinute", path)
    namespaces = None
    if doc.get("namespaces") is not None:
        namespaces = frozenset(name for name, _ in each(doc, "namespaces", str, path))
    wakes = SCALE_FROM_ZERO
    if doc.get("maxScaleFromZero") is not None:
        wakes = integer(doc, "maxScaleFromZero", path, low=0)
    return TenantLimits(
        name=field(doc, "name", str, path),
        requests_per_s=math.inf if rate is None else rate,
        burst=burst,
        tokens_per_minute=math.inf if tokens is None else tokens,
        max_concurrent=concurrent,
        namespaces=namespaces,
        max_scale_from_zero=wakes,
    )


def _keys(doc: dict[str, Any], path: str) -> list[tuple[bytes, str]]:
    """Each key's SHA-256 digest, with where it was listed: a plain key, or its digest."""
    keys = each(doc, "keys", str, path)
    if not keys:
        raise ContractError(join(path, "keys"), "must name at least one key")
    return [(_listed_digest(key, where), where) for key, where in keys]


def _listed_digest(key: str, where: str) -> bytes:
    if key.startswith(HASHED):
        hexits = key.removeprefix(HASHED)
        if not _HEX_DIGEST.fullmatch(hexits):
            raise ContractError(where, f"{HASHED} is followed by 64 lowercase hex digits")
        return bytes.fromhex(hexits)
    if len(key) < MIN_KEY_CHARS or not key.isascii() or not key.isprintable() or " " in key:
        raise ContractError(
            where, f"a key is at least {MIN_KEY_CHARS} printable ASCII characters, no spaces"
        )
    return _digest(key)


def _positive(doc: dict[str, Any], key: str, path: str) -> float | None:
    value = doc.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ContractError(join(path, key), f"expected a number, got {value!r}")
    if value <= 0:
        raise ContractError(join(path, key), f"must be above 0, got {value}")
    return float(value)
