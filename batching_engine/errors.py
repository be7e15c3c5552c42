"""Every way the engine refuses or fails a request, one exception type each.

The scheduler, the async engine and the dynamic batcher raise these; the HTTP server maps
them to status codes (`server/errors.py`). They live apart from both so that each side
names the same type: a full queue is one QueueFullError, whichever queue was full.
"""

from __future__ import annotations

from infergrid.errors import ContractError


class QueueFullError(Exception):
    """A queue (the scheduler's or the dynamic batcher's) has no room: retry later (a 429)."""


class QueueTimeoutError(Exception):
    """The request waited in the dynamic batcher's queue longer than its timeout."""


class InvalidRequestError(ContractError):
    """A request the engine can never serve as asked; the message names the field."""


class RequestTooLongError(InvalidRequestError):
    """The prompt, or the prompt plus max_tokens, does not fit the model or the KV cache."""


class EngineDrainingError(Exception):
    """The engine is shutting down and takes no new requests."""


class EngineFailedError(Exception):
    """The model step raised; the request cannot go on. Our fault, not the client's."""
