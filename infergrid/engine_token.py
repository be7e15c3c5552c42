"""The token an engine asks of its callers, and the one place it is derived.

An engine's pod network is reachable from every pod where the network plugin does not
enforce NetworkPolicy, so each engine may demand a token on /v1/*. One token for all of
them would let a tenant that reads its own namespace's token Secret call every other
tenant's engines. So each InferenceService's token is HMAC-SHA256 of a key only the
operator and the gateway hold, over "namespace/name": the operator writes it into the
service's namespace for its engine pods, and the gateway derives the same value for the
service it forwards to. A tenant learns its own services' tokens and nothing else.

The engine reads it from a file named by `TOKEN_FILE_ENV` and compares in constant time.
It travels in a header of its own (`HEADER`), never `Authorization`, which carries a
client's API key to the gateway and is never forwarded to an engine.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import replace
from pathlib import Path
from typing import Final, Protocol, TypeVar

from infergrid.errors import ContractError

HEADER: Final = "X-InferGrid-Engine-Token"
TOKEN_FILE_ENV: Final = "INFERGRID_ENGINE_TOKEN_FILE"
SECRET_KEY: Final = "token"  # the data key of the per-service Secret the operator writes
MIN_KEY_BYTES: Final = 32  # 256 bits, HMAC-SHA256's own strength
KEY_FILE_SETTING: Final = "engineTokenKeyFile"  # the operator's and the gateway's


def derive(key: bytes, namespace: str, name: str) -> str:
    """The token of the InferenceService `namespace/name`, as hex."""
    if not key:
        raise ValueError("an engine token needs a key")
    return hmac.new(key, f"{namespace}/{name}".encode(), hashlib.sha256).hexdigest()


def matches(expected: str, presented: str | None) -> bool:
    """Whether a caller presented the token; constant time, so timing tells nothing of it."""
    return presented is not None and hmac.compare_digest(
        expected.encode(), presented.encode(errors="replace")
    )


def read_key(path: str) -> bytes:
    """The key in the file `path` (surrounding whitespace dropped), at least 32 bytes; an
    empty path means no key, so no engine tokens. A refusal names the setting."""
    if not path:
        return b""
    try:
        value = Path(path).read_bytes().strip()
    except OSError as err:
        raise ContractError(KEY_FILE_SETTING, f"cannot read {path}: {err.strerror}") from None
    if len(value) < MIN_KEY_BYTES:
        raise ContractError(
            KEY_FILE_SETTING, f"{path} holds {len(value)} bytes; a key needs {MIN_KEY_BYTES}"
        )
    return value


class _KeyHolder(Protocol):
    engine_token_key_file: str
    engine_token_key: bytes


K = TypeVar("K", bound=_KeyHolder)


def with_key(cfg: K) -> K:
    """A part's settings with the key its `engine_token_key_file` names read in, once, at
    start: the settings file holds the key's path, never the key."""
    return replace(cfg, engine_token_key=read_key(cfg.engine_token_key_file))
