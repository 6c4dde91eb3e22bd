"""One `/v1/completions` request: one engine session per prompt, answered whole or as SSE.

Each prompt runs as a session of the request's call (`Engine.call`, as a gRPC Generate of
one text turn): text is tokenized with BOS as gRPC's input is (`SessionHandle.needs_bos`),
token ids are checked against the vocabulary. Their events come tagged by prompt (each
session with its own backlog), observed and recorded by the engine, and each becomes
choice `prompt * n + sample`, OpenAI's order. Every session closes however the request
ends: a client that disconnects cancels the handler (aiohttp's handler_cancellation),
which closes them all, so the slots are free before the next executor step.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import aclosing

from aiohttp import web

from ..domain import request_rules
from ..domain.errors import Field, InvalidRequest
from ..domain.events import PromptLogprobsEvent, TokenEvent, TurnEndEvent
from ..domain.requests import SessionParams
from ..engine.engine import Call, Engine, Usage
from . import shapes
from .completion_request import CompletionRequest
from .errors import from_exception
from .legacy_logprobs import LegacyLogprobs
from .sse import serve_stream, write_event


async def prompt_tokens(engine: Engine, prompt: str | list[int], needs_bos: bool, where: str) -> tuple[int, ...]:
    if isinstance(prompt, list):
        return request_rules.token_ids(prompt, engine.n_vocab(), where)
    return await engine.tokenize_async(prompt, needs_bos, True)


async def _send_prompts(engine: Engine, request: CompletionRequest, call: Call) -> None:
    """Each prompt a session of the call, its tokens one turn; a refusal names the prompt."""
    for i, prompt in enumerate(request.prompts):
        handle = call.open()
        where = "prompt" if len(request.prompts) == 1 else f"prompt[{i}]"
        try:
            handle.add_tokens(await prompt_tokens(engine, prompt, handle.needs_bos, where), True)
        except InvalidRequest as exc:  # the engine names a turn's input `input`: here it is this prompt
            error = from_exception(exc)
            assert error is not None
            error.param = where if exc.field in (Field.INPUT, Field.END_OF_TURN) else error.param
            raise error from None


class CompletionResponder:
    def __init__(self, engine: Engine, request: CompletionRequest, params: SessionParams, model: str) -> None:
        self.engine = engine
        self.request = request
        self.params = params
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

    def _events(self) -> AsyncIterator[tuple[int, shapes.Event]]:
        """(prompt, event) of every prompt's session (one turn each)."""
        async def start(call: Call) -> None:
            await _send_prompts(self.engine, self.request, call)

        return shapes.call_events(self.engine.call(self.params, self.request.deadline), start)

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
             "finish_reason": shapes.finish(ends[c])}
            for c in range(self.num_choices)
        ]
        return web.json_response({**self.head, "choices": choices, "usage": self._tokens_used(ends)})

    def _tokens_used(self, ends: dict[int, TurnEndEvent]) -> dict[str, object]:
        return shapes.usage(Usage.of(ends, self.n, completions=not self.request.prompt_only))

    async def stream(self, http_request: web.Request) -> web.StreamResponse:
        """SSE: each choice's text deltas (its first starts with the echoed prompt, when
        asked), a chunk with its finish reason, the usage when asked, `[DONE]`
        (sse.serve_stream)."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        ends: dict[int, TurnEndEvent] = {}
        logprobs = self._new_logprobs()
        started: set[int] = set()

        async def events() -> None:
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
                        finish = shapes.finish(event)
                    chunk_logprobs = lp.take() if (lp := logprobs[c]) is not None else None
                    if text or chunk_logprobs or finish:
                        await self._send(response, _delta(c, text, finish, chunk_logprobs))

        async def last() -> None:
            if self.request.include_usage:
                await self._send(response, None, self._tokens_used(ends))

        return await serve_stream(response, events, last)

    async def _send(self, response: web.StreamResponse, choice: dict[str, object] | None,
                    usage: dict[str, object] | None = None) -> None:
        chunk: dict[str, object] = {**self.head, "choices": [choice] if choice is not None else []}
        if self.request.include_usage:  # null on every chunk but the last
            chunk["usage"] = usage
        await write_event(response, chunk)


def _delta(index: int, text: str, finish: str | None, logprobs: dict[str, object] | None) -> dict[str, object]:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}
