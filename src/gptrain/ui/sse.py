"""Server-Sent Events: a page subscribes once and the server pushes what changed.

`stream(request, tick)` calls `tick()` (blocking reads: run in a worker thread) every `interval`
seconds and sends each (event, data) it returns as one SSE message of compact JSON; a comment
line keeps idle connections open through proxies. It ends when the browser goes away.
"""

from __future__ import annotations

import asyncio
import json
import time

from starlette.concurrency import run_in_threadpool
from starlette.responses import StreamingResponse

KEEPALIVE_S = 15.0


def message(event: str, data) -> str:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


def stream(request, tick, interval: float = 1.0) -> StreamingResponse:
    async def events():
        quiet_since = time.monotonic()
        while not await request.is_disconnected():
            out = await run_in_threadpool(tick)
            if out:
                yield "".join(message(event, data) for event, data in out)
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since > KEEPALIVE_S:
                yield ": keepalive\n\n"
                quiet_since = time.monotonic()
            await asyncio.sleep(interval)

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
