"""The routes agents use beside chat completions: Anthropic Messages (`POST /v1/messages`,
`/v1/messages/count_tokens`: anthropic.py) and OpenAI Responses (`POST /v1/responses`:
responses_api.py). Each is the chat route's call under another request and reply shape;
the surface (surface.py) registers them and renders their errors (Anthropic's object on
the Messages routes)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from aiohttp import web

from ..domain.requests import SessionParams
from ..engine.engine import Engine
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
        chat, model, params = self._call(request, engine, body.chat)
        with engine.session_gate.admitted():
            responder = ResponsesResponder(engine, chat, params, model)
            if chat.stream:
                return await responder.stream_response(request, body.body)
            return await responder.whole_response(body.body)

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
