"""The one request an engine answers before it calls itself ready.

A loaded model is not yet a serving one: the first pass pays for lazy allocations, Triton's
kernel compilation and the allocator's first growth, and a broken device or kernel shows only
then. So readiness waits for one short request through the path clients use (the engine's
queue for generation, the dynamic batcher for single-pass tasks); a failure stops the pod
before any traffic reaches it.
"""

from __future__ import annotations

import time

from batching_engine.errors import EngineFailedError
from batching_engine.sequence import SamplingParams, Sequence
from batching_engine.server.handler_context import HandlerContext
from batching_engine.server.served_model import GENERATION_TASK

WARM_UP_TEXT = "Hello"


async def warm_up(server: HandlerContext) -> float:
    """Run one request to the end; its seconds. Raises EngineFailedError if it fails."""
    model = server.require_model()
    ids = model.tokenizer.encode(WARM_UP_TEXT)[: model.max_model_len - 1] or [0]
    started = time.monotonic()
    if model.task == GENERATION_TASK:
        params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
        stream = await server.require_engine().submit(Sequence(ids, params))
        async for delta in stream:
            if delta.error is not None:
                raise EngineFailedError(delta.error)
    else:
        await server.require_batcher().submit([ids])
    return time.monotonic() - started
