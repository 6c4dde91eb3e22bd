"""The routes agents use beside chat completions: Anthropic Messages (`POST /v1/messages`,
`/v1/messages/count_tokens`: anthropic.py) and OpenAI Responses (`POST /v1/responses`:
responses_api.py). Each is the chat route's call under another request and reply shape;
the surface (surface.py) registers them and renders their errors (Anthropic's object on
the Messages routes)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from aiohttp import web

from ..domain.events import TurnEndEvent
from ..domain.requests import SessionParams
from ..engine.engine import ChatMessage, Engine, owner_of
from .anthropic import MessagesResponder
from .anthropic_request import parse_count_request, parse_messages_request
from .body import parsed_body
from .errors import ApiError
from .fields import known_model
from .request import SURFACE, ChatRequest
from .responses_api import ResponsesResponder
from .responses_request import parse_responses_request
from .telemetry import request_deadline


class AgentRoutes:
    def __init__(self, engine: Callable[[], Engine], model_names: Callable[[Engine], tuple[str, ...]]) -> None:
        """`engine()`: the engine, or a 503 while it loads or the server drains."""
        self._engine = engine
        self._model_names = model_names

    def _call(self, request: web.Request, engine: Engine, chat: ChatRequest) -> tuple[ChatRequest, str, SessionParams]:
        chat = replace(chat, deadline=request_deadline(request))
        model = known_model(chat.model, self._model_names(engine))
        params = replace(chat.session_params(request["request_id"], engine.limits), surface=SURFACE)
        return chat, model, params

    async def messages(self, request: web.Request) -> web.StreamResponse:
        engine = self._engine()
        body = await parsed_body(request, engine, parse_messages_request)
        chat, model, params = self._call(request, engine, body.chat)
        with engine.session_gate.admitted():  # open sessions of every route: the slots plus --max-queue
            responder = MessagesResponder(engine, chat, params, model)
            return await (responder.stream(request) if body.stream else responder.whole())

    async def responses(self, request: web.Request) -> web.StreamResponse:
        engine = self._engine()
        body = await parsed_body(request, engine, parse_responses_request)
        owner = owner_of(_credentials(request))
        history = self._history(engine, body.previous_id, owner)
        chat, model, params = self._call(request, engine, body.chat)
        k = body.num_instructions
        if history:  # the stored conversation after the instructions, before the new input
            chat = replace(chat, messages=[*chat.messages[:k], *history, *chat.messages[k:]])
        said = tuple(chat.messages[k:])

        def store(whole: dict[str, object], text: str, end: TurnEndEvent) -> None:
            if body.store:
                engine.conversations.put(str(whole["id"]), owner, (*said, ChatMessage("assistant", text, end.tool_calls)),
                                         whole, body.items)

        with engine.session_gate.admitted():
            responder = ResponsesResponder(engine, chat, params, model, on_done=store)
            if chat.stream:
                return await responder.stream_response(request, body.body)
            return await responder.whole_response(body.body)

    @staticmethod
    def _history(engine: Engine, previous_id: str | None, owner: str) -> tuple[ChatMessage, ...]:
        if previous_id is None:
            return ()
        stored = engine.conversations.get(previous_id, owner)
        if stored is None:
            raise ApiError(400, f"previous response {previous_id!r} not found (never stored, deleted, or expired)",
                           param="previous_response_id", code="previous_response_not_found")
        return stored.messages

    async def stored_response(self, request: web.Request) -> web.Response:
        """`GET /v1/responses/{id}`: a stored response object; `DELETE`: forget it."""
        engine = self._engine()
        key, owner = request.match_info["response_id"], owner_of(_credentials(request))
        if request.method == "DELETE":
            if not engine.conversations.delete(key, owner):
                raise _not_found(key)
            return web.json_response({"id": key, "object": "response.deleted", "deleted": True})
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
        engine = self._engine()
        chat = await parsed_body(request, engine, parse_count_request)
        known_model(chat.model, self._model_names(engine))
        if engine.chat_template is None:
            raise ApiError(400, "the model has no chat template: start the server with --chat-template-file")
        tools = chat.tools if chat.tools is not None and chat.tools.active else None  # as a turn renders them
        size = 1 + sum(len(m.content) for m in chat.messages)  # rendered off the loop, as a chat turn is
        tokens = await engine.off_loop(size, engine.render_chat, chat.messages, tools, large=0)
        return web.json_response({"input_tokens": len(tokens)})


def _credentials(request: web.Request) -> str:
    """What the caller authenticated with (its key), whose digest owns what it stores."""
    return request.headers.get("Authorization", "") or request.headers.get("x-api-key", "")


def _not_found(key: str) -> ApiError:
    return ApiError(404, f"no stored response {key!r}", param="response_id", code="not_found")
