"""The routes agents use beside chat completions: Anthropic Messages (`POST /v1/messages`,
`/v1/messages/count_tokens`: anthropic.py) and OpenAI Responses (`POST /v1/responses`:
responses_api.py). Each is the chat route's call under another request and reply shape;
the surface (surface.py) registers them and renders their errors (Anthropic's object on
the Messages routes)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TypeVar

from aiohttp import web

from ..domain.events import TurnEndEvent
from ..domain.requests import SessionParams
from ..engine.engine import ChatMessage, Engine, ToolFormat, continued, owner_of
from ..open_calls import OpenCalls
from .adapters import model_and_adapters
from .anthropic import MessagesResponder
from .anthropic_request import parse_count_request, parse_messages_request
from .background import BackgroundResponses
from .errors import ApiError
from .request import SURFACE, ChatRequest
from .responses_api import ResponsesResponder
from .responses_request import ResponsesRequest, parse_responses_request
from .routing import ModelRouter
from .telemetry import request_deadline

T = TypeVar("T")


class AgentRoutes:
    def __init__(self, router: ModelRouter, model_names: Callable[[Engine], tuple[str, ...]],
                 calls: OpenCalls) -> None:
        """`router`: the engine of the model a body names (routing.py), or a 503 while it loads
        or the server drains; `calls`: the open calls the drain waits for (a background response is one)."""
        self._router = router
        self._engine = router.default  # stored responses: every model's are kept with the default's
        self._model_names = model_names
        self._calls = calls
        self._background = BackgroundResponses()

    def _call(self, request: web.Request, engine: Engine, chat: ChatRequest) -> tuple[ChatRequest, str, SessionParams]:
        chat = replace(chat, deadline=request_deadline(request))
        model, adapters = model_and_adapters(engine, chat.model, chat.lora, self._model_names(engine))
        params = replace(chat.session_params(request["request_id"], engine.limits), surface=SURFACE, adapters=adapters)
        return chat, model, params

    async def messages(self, request: web.Request) -> web.StreamResponse:
        async with self._router.body(request, lambda engine: _reading(parse_messages_request, engine)) as routed:
            engine, body = routed
            chat, model, params = self._call(request, engine, body.chat)
            with engine.session_gate.admitted():  # open sessions of every route: the slots plus --max-queue
                responder = MessagesResponder(engine, chat, params, model)
                return await (responder.stream(request) if body.stream else responder.whole())

    async def responses(self, request: web.Request) -> web.StreamResponse:
        async with self._router.body(request, lambda engine: _reading(parse_responses_request, engine)) as routed:
            return await self._respond(request, *routed)

    async def _respond(self, request: web.Request, engine: Engine, body: ResponsesRequest) -> web.StreamResponse:
        owner = owner_of(_credentials(request))
        chat, model, params = self._call(request, engine, self._continued(engine, body, owner))
        said = tuple(chat.messages[body.num_instructions:])

        def store(whole: dict[str, object], text: str, end: TurnEndEvent) -> None:
            if body.store:
                engine.conversations.put(str(whole["id"]), owner, (*said, ChatMessage("assistant", text, end.tool_calls)),
                                         whole, body.items)

        responder = await _with_kv(engine, body, owner, ResponsesResponder(engine, chat, params, model, on_done=store))
        if body.background:
            return self._in_background(engine, body, owner, responder)
        with engine.session_gate.admitted():
            if chat.stream:
                return await responder.stream_response(request, body.body)
            return await responder.whole_response(body.body)

    def _in_background(self, engine: Engine, body: ResponsesRequest, owner: str,
                       responder: ResponsesResponder) -> web.Response:
        """Answer `queued` now; the turn runs as a task (background.py), stored when it ends."""
        said = tuple(body.chat.messages[body.num_instructions:])

        def stop(record: dict[str, object]) -> None:
            engine.conversations.put(responder.response_id, owner, said, record, body.items)

        record = responder.response(body.body, [], None)
        holds = [engine.session_gate.admitted(), self._calls.counted()]
        queued = self._background.start(responder.response_id, owner, record, holds,
                                        lambda: responder.whole_response(body.body), stop)
        return web.json_response(queued)

    async def cancel(self, request: web.Request) -> web.Response:
        """`POST /v1/responses/{id}/cancel`: a running background response ends `cancelled`;
        a finished one is returned as it is."""
        engine = self._engine()
        key, owner = request.match_info["response_id"], owner_of(_credentials(request))
        await self._background.cancel(key, owner)
        stored = engine.conversations.get(key, owner)
        if stored is None:
            raise _not_found(key)
        return web.json_response(stored.record)

    @staticmethod
    def _continued(engine: Engine, body: ResponsesRequest, owner: str) -> ChatRequest:
        """The request's chat, with the stored conversation it continues (if any) after the
        instructions and before the new input."""
        if body.previous_id is None:
            return body.chat
        stored = engine.conversations.get(body.previous_id, owner)
        if stored is None:
            raise ApiError(400, f"previous response {body.previous_id!r} not found (never stored, deleted, or expired)",
                           param="previous_response_id", code="previous_response_not_found")
        return replace(body.chat, messages=continued(stored, body.chat.messages, body.num_instructions))

    async def input_tokens(self, request: web.Request) -> web.Response:
        """`POST /v1/responses/input_tokens`: the prompt the same `/v1/responses` request would prefill."""
        async with self._router.body(request, lambda engine: _reading(parse_responses_request, engine)) as routed:
            engine, body = routed
            chat = self._continued(engine, body, owner_of(_credentials(request)))
            model_and_adapters(engine, chat.model, (), self._model_names(engine))
            num_tokens = await _prompt_tokens(engine, chat)
        return web.json_response({"object": "response.input_tokens", "input_tokens": num_tokens})

    async def stored_response(self, request: web.Request) -> web.Response:
        """`GET /v1/responses/{id}`: a stored response object; `DELETE`: forget it."""
        engine = self._engine()
        key, owner = request.match_info["response_id"], owner_of(_credentials(request))
        if request.method == "DELETE":
            cancelled = await self._background.cancel(key, owner)  # a running one is cancelled, then deleted
            if not engine.conversations.delete(key, owner) and not cancelled:
                raise _not_found(key)
            await engine.stored_kv.discard(key)
            return web.json_response({"id": key, "object": "response.deleted", "deleted": True})
        running = self._background.get(key, owner)
        if running is not None:
            return web.json_response(running)
        stored = engine.conversations.get(key, owner)
        if stored is None:
            raise _not_found(key)
        return web.json_response(stored.record)

    async def input_items(self, request: web.Request) -> web.Response:
        """`GET /v1/responses/{id}/input_items`: the stored turn's input, as items."""
        key = request.match_info["response_id"]
        stored = self._engine().conversations.get(key, owner_of(_credentials(request)))
        if stored is None:
            raise _not_found(key)
        items = list(stored.items)
        return web.json_response({"object": "list", "data": items, "has_more": False,
                                  "first_id": items[0]["id"] if items else None,
                                  "last_id": items[-1]["id"] if items else None})

    async def count_tokens(self, request: web.Request) -> web.Response:
        """The prompt a `/v1/messages` turn with these messages, system and tools would prefill."""
        async with self._router.body(request, lambda engine: _reading(parse_count_request, engine)) as routed:
            engine, chat = routed
            model_and_adapters(engine, chat.model, (), self._model_names(engine))
            num_tokens = await _prompt_tokens(engine, chat)
        return web.json_response({"input_tokens": num_tokens})


def _reading(parse: Callable[[object, ToolFormat], T], engine: Engine) -> Callable[[object], T]:
    """`parse` with the model's tool format."""
    return lambda value: parse(value, engine.tool_format)


def _credentials(request: web.Request) -> str:
    """What the caller authenticated with (its key), whose digest owns what it stores."""
    return request.headers.get("Authorization", "") or request.headers.get("x-api-key", "")


async def _with_kv(engine: Engine, body: ResponsesRequest, owner: str,
                   responder: ResponsesResponder) -> ResponsesResponder:
    """With --session-dir a stored response's KV is saved under its id, and a continuation
    starts from the previous one's where engine/stored_kv.py says (`continued`)."""
    if body.store:
        responder.params = replace(responder.params, session_id=engine.stored_kv.session_id(responder.response_id))
    previous = engine.conversations.get(body.previous_id, owner) if body.previous_id is not None else None
    if previous is not None:
        responder.prefix = await engine.stored_kv.continued(str(body.previous_id), previous)
    return responder


def _not_found(key: str) -> ApiError:
    return ApiError(404, f"no stored response {key!r}", param="response_id", code="not_found")


async def _prompt_tokens(engine: Engine, chat: ChatRequest) -> int:
    """How many tokens the chat's turn would prefill: its messages (and an active tool plan's
    preamble) rendered as a turn renders them, off the event loop."""
    if engine.chat_template is None:
        raise ApiError(400, "the model has no chat template: start the server with --chat-template-file")
    tools = chat.tools if chat.tools is not None and chat.tools.active else None
    size = 1 + sum(len(m.content) for m in chat.messages)
    return len(await engine.off_loop(size, engine.render_chat, chat.messages, tools, large=0))
