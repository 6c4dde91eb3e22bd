"""Responses run in the background (`background: true`, OpenAI's Responses API): the request
is answered at once with the response `queued`, the turn runs as a task on the event
loop, `GET /v1/responses/{id}` shows it (`in_progress`, then the stored response), and
`POST /v1/responses/{id}/cancel` ends it `cancelled`.

A task holds what a request would: a place among the open sessions (`session_gate`,
taken when the request is answered, so a full server refuses it then) and an open call
(the drain waits for it, as for any call). When it ends, its response is stored like any
`store: true` response (completed, incomplete, cancelled, or failed with its error), so
it is found, continued and listed by the same routes, and survives a restart with
`--session-dir`. Event loop only.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import structlog

from ..domain.errors import Overloaded
from .errors import from_exception, server_error

log = structlog.get_logger("llmserve.http.background")

MAX_RUNNING = 256  # background responses running or queued at once, per server

# What a task does: the turn, storing the finished response (the route's `on_done`).
Run = Callable[[], Awaitable[object]]
# What stores a response that ended otherwise: cancelled, or failed with its error.
Stop = Callable[[dict[str, object]], None]


@dataclass
class _Running:
    owner: str
    record: dict[str, object]  # the response as GET shows it while it runs
    stop: Stop
    task: asyncio.Task[None] | None = None
    hold: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    stopped: bool = False  # its end is stored

    def end(self, status: str, error: dict[str, object] | None = None) -> None:
        if not self.stopped:
            self.stopped = True
            self.stop({**self.record, "status": status, "error": error})


class BackgroundResponses:
    def __init__(self) -> None:
        self._running: dict[str, _Running] = {}

    def start(self, response_id: str, owner: str, record: dict[str, object],
              holds: list[contextlib.AbstractContextManager[object]], run: Run, stop: Stop) -> dict[str, object]:
        """Run `run` as a task; the `queued` response to answer with. `holds` are entered now
        (a refusal is the request's) and left when the task ends; `stop` stores a response
        that ends without `run` storing it (cancelled, failed)."""
        if len(self._running) >= MAX_RUNNING:
            raise Overloaded(f"{MAX_RUNNING} background responses are running: wait for one to end")
        running = _Running(owner, {**record, "status": "in_progress"}, stop)
        with contextlib.ExitStack() as entered:
            for hold in holds:
                entered.enter_context(hold)
            running.hold = entered.pop_all()
        running.task = asyncio.get_running_loop().create_task(self._run(running, run))
        running.task.add_done_callback(lambda task: self._ended(response_id, running, task))
        self._running[response_id] = running
        return {**record, "status": "queued"}

    @staticmethod
    async def _run(running: _Running, run: Run) -> None:
        try:
            await run()
            running.stopped = True  # `run` stored it
        except asyncio.CancelledError:
            running.end("cancelled")
        except Exception as exc:  # the response fails, the server goes on
            error = from_exception(exc)
            if error is None:
                log.exception("background_response_failed")
                error = server_error()
            running.end("failed", {"code": error.code or error.kind, "message": error.message})

    def _ended(self, response_id: str, running: _Running, task: asyncio.Task[None]) -> None:
        if task.cancelled():  # cancelled before it ran
            running.end("cancelled")
        running.hold.close()
        self._running.pop(response_id, None)

    def get(self, response_id: str, owner: str) -> dict[str, object] | None:
        """A running response's record (None: not running, or another key's)."""
        running = self._running.get(response_id)
        return running.record if running is not None and running.owner == owner else None

    async def cancel(self, response_id: str, owner: str) -> bool:
        """End a running response `cancelled` (stored as such); False if none runs under this id."""
        running = self._running.get(response_id)
        if running is None or running.owner != owner or running.task is None:
            return False
        running.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running.task
        return True
