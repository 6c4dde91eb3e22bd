"""One `/v1/completions` request: one engine session per prompt, answered whole or as SSE.

Each prompt runs as a session of its own (as a gRPC Generate of one text turn): text is
tokenized with BOS as gRPC's input is (`SessionHandle.needs_bos`), token ids are checked
against the vocabulary. Their events share one queue, tagged by prompt; each is shown to
its session (`observe`) and becomes choice `prompt * n + sample`, OpenAI's order. Every
session closes however the request ends: a client that disconnects cancels the handler
(aiohttp's handler_cancellation), which closes them all, so the slots are free before the
next executor step.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import aclosing

import structlog
from aiohttp import web

from ..domain import request_rules
from ..domain.errors import Field, InvalidRequest
from ..domain.events import FinishReason, PromptLogprobsEvent, SessionFailed, TokenEvent, TurnEndEvent
from ..domain.requests import SessionParams
from ..engine.engine import Engine, LoopSink, SessionHandle
from ..turn_record import record_turn, turn_recorder
from . import shapes
from .completion_request import CompletionRequest
from .errors import bad_request, from_exception, from_failure, server_error
from .legacy_logprobs import LegacyLogprobs
from .sse import end_stream, write_event

log = structlog.get_logger("llmserve.http.completions")

Event = TokenEvent | PromptLogprobsEvent | TurnEndEvent


class _PromptSink:
    """One prompt's session's sink: its events go to the request's shared queue, tagged;
    its own backlog, so that the executor pauses a prompt only for its own unread events."""

    def __init__(self, shared: LoopSink, prompt: int) -> None:
        self._shared = shared
        self._prompt = prompt
        self._num_put = 0  # written by the executor thread only
        self.num_taken = 0  # written by the loop thread only

    @property
    def backlog(self) -> int:
        return self._num_put - self.num_taken

    def put(self, event: object) -> None:
        self._num_put += 1
        self._shared.put((self._prompt, event))


async def prompt_tokens(engine: Engine, prompt: str | list[int], needs_bos: bool, where: str) -> tuple[int, ...]:
    if isinstance(prompt, list):
        return request_rules.token_ids(prompt, engine.n_vocab(), where)
    return tuple(await engine.tokenized(prompt, needs_bos, True))


async def prompt_events(engine: Engine, request: CompletionRequest, params: SessionParams,
                        max_input_tokens: int) -> AsyncIterator[tuple[int, Event]]:
    """(prompt, event) for every prompt's session, each event shown to its session first;
    ends after every prompt's last turn end. ApiError when the engine refuses or ends one."""
    shared = LoopSink(asyncio.get_running_loop())
    handles: list[SessionHandle] = []
    sinks: list[_PromptSink] = []
    closed: set[int] = set()
    try:
        for i, prompt in enumerate(request.prompts):
            sinks.append(_PromptSink(shared, i))
            handle = engine.open_session(params, sinks[i], max_input_tokens, request.deadline)
            handles.append(handle)
            where = "prompt" if len(request.prompts) == 1 else f"prompt[{i}]"
            try:
                handle.add_tokens(await prompt_tokens(engine, prompt, handle.needs_bos, where), True)
            except InvalidRequest as exc:  # the engine names a turn's input `input`: here it is this prompt
                error = from_exception(exc)
                assert error is not None
                error.param = where if exc.field in (Field.INPUT, Field.END_OF_TURN) else error.param
                raise error from None
        num_open = len(handles)
        while num_open:
            i, event = await shared.get()  # type: ignore[misc]
            sinks[i].num_taken += 1
            if isinstance(event, SessionFailed):
                raise from_failure(event.kind, event.message)
            if not isinstance(event, (TokenEvent, PromptLogprobsEvent, TurnEndEvent)):
                continue
            await handles[i].observe(event)
            if isinstance(event, TurnEndEvent):
                record_turn(engine.metrics, event, params)
                if event.finish_reason == FinishReason.ERROR:
                    raise bad_request(event.message or "the turn failed")
                if event.final:  # one turn per session: its slot serves the next prompt at once
                    handles[i].close()
                    closed.add(i)
                    num_open -= 1
            yield i, event
    finally:
        record = turn_recorder(engine.metrics, params)
        shared.orphans_to(lambda tagged: record(tagged[1]))  # (prompt, event): a turn the close cancels is counted
        for i, handle in enumerate(handles):
            if i not in closed:
                handle.close()


class CompletionResponder:
    def __init__(self, engine: Engine, request: CompletionRequest, params: SessionParams, model: str,
                 max_input_tokens: int) -> None:
        self.engine = engine
        self.request = request
        self.params = params
        self.max_input_tokens = max_input_tokens
        self.n = params.num_samples
        self.num_choices = len(request.prompts) * self.n
        self.head = {"id": f"cmpl-{params.request_id}", "object": "text_completion", "created": int(time.time()),
                     "model": model, "system_fingerprint": f"llmserve-{engine.version}"}
        self._prompt_texts: dict[int, str] = {}

    def _piece(self, token_id: int) -> str:
        return self.engine.pieces([token_id])[0].decode("utf-8", "replace")

    def _echo(self, prompt: int) -> str:
        """What `echo` shows first: the prompt as sent (token ids detokenized); "" without echo."""
        if not self.request.echo:
            return ""
        if prompt not in self._prompt_texts:
            item = self.request.prompts[prompt]
            self._prompt_texts[prompt] = item if isinstance(item, str) else self.engine.detokenize(item, False)
        return self._prompt_texts[prompt]

    def _choices_of(self, prompt: int) -> range:
        return range(prompt * self.n, (prompt + 1) * self.n)

    def _new_logprobs(self) -> list[LegacyLogprobs | None]:
        if self.request.logprobs is None:
            return [None] * self.num_choices
        return [LegacyLogprobs(self._piece, self._echo(c // self.n)) for c in range(self.num_choices)]

    def _events(self) -> AsyncIterator[tuple[int, Event]]:
        return prompt_events(self.engine, self.request, self.params, self.max_input_tokens)

    async def whole(self) -> web.Response:
        texts = [[self._echo(c // self.n)] for c in range(self.num_choices)]
        logprobs = self._new_logprobs()
        ends: dict[int, TurnEndEvent] = {}
        async with aclosing(self._events()) as events:
            async for prompt, event in events:
                if isinstance(event, PromptLogprobsEvent):
                    for c in self._choices_of(prompt):
                        if (lp := logprobs[c]) is not None:
                            lp.add_prompt(event)
                    continue
                c = prompt * self.n + event.index
                if isinstance(event, TokenEvent):
                    if self.request.prompt_only:
                        continue
                    texts[c].append(event.text)
                    if (lp := logprobs[c]) is not None:
                        lp.add(event)
                else:
                    ends[c] = event
        choices = [
            {"index": c, "text": "".join(texts[c]), "logprobs": lp.whole() if (lp := logprobs[c]) is not None else None,
             "finish_reason": _finish(ends[c])}
            for c in range(self.num_choices)
        ]
        return web.json_response({**self.head, "choices": choices, "usage": self._usage(ends)})

    def _usage(self, ends: dict[int, TurnEndEvent]) -> dict[str, object]:
        """Each prompt once (its samples share it), every sample's completion."""
        firsts = [ends[p * self.n] for p in range(len(self.request.prompts))]
        prompt = sum(end.prompt_tokens for end in firsts)
        completion = 0 if self.request.prompt_only else sum(end.completion_tokens for end in ends.values())
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": sum(end.cached_tokens for end in firsts)}}

    async def stream(self, http_request: web.Request) -> web.StreamResponse:
        """SSE: each choice's text deltas (its first starts with the echoed prompt, when
        asked), a chunk with its finish reason, the usage when asked, `[DONE]`. An error
        after the headers went out is an `error` event instead."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        ends: dict[int, TurnEndEvent] = {}
        logprobs = self._new_logprobs()
        started: set[int] = set()
        try:
            async with aclosing(self._events()) as events:
                async for prompt, event in events:
                    if not response.prepared:  # the headers wait for the first event: earlier errors keep their status
                        await response.prepare(http_request)
                    if isinstance(event, PromptLogprobsEvent):
                        for c in self._choices_of(prompt):
                            if (lp := logprobs[c]) is not None:
                                lp.add_prompt(event)
                        continue
                    if isinstance(event, TokenEvent) and self.request.prompt_only:
                        continue
                    c = prompt * self.n + event.index
                    text = "" if c in started else self._echo(prompt)
                    started.add(c)
                    finish = None
                    if isinstance(event, TokenEvent):
                        text += event.text
                        if (lp := logprobs[c]) is not None:
                            lp.add(event)
                    else:
                        ends[c] = event
                        finish = _finish(event)
                    chunk_logprobs = lp.take() if (lp := logprobs[c]) is not None else None
                    if text or chunk_logprobs or finish:
                        await self._send(response, _delta(c, text, finish, chunk_logprobs))
        except ConnectionError:
            return response  # the client went away: the sessions are closed (aclosing)
        except Exception as exc:  # noqa: BLE001 - before the headers: the status; after: an error event
            if not response.prepared:
                raise
            error = from_exception(exc)
            if error is None:
                log.exception("stream_failed")
                error = server_error()
            await end_stream(response, error.body())
            return response
        try:
            if self.request.include_usage:
                await self._send(response, None, self._usage(ends))
        except ConnectionError:
            return response  # the client left after the last event
        await end_stream(response)
        return response

    async def _send(self, response: web.StreamResponse, choice: dict[str, object] | None,
                    usage: dict[str, object] | None = None) -> None:
        chunk: dict[str, object] = {**self.head, "choices": [choice] if choice is not None else []}
        if self.request.include_usage:  # null on every chunk but the last
            chunk["usage"] = usage
        await write_event(response, chunk)


def _finish(end: TurnEndEvent) -> str:
    return shapes.FINISH_REASONS.get(end.finish_reason, "stop")


def _delta(index: int, text: str, finish: str | None, logprobs: dict[str, object] | None) -> dict[str, object]:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}
