"""Which model serves an HTTP request: the body's `model`, when it names a further model
(`--model NAME=PATH`, served_models.py); else the default model, which answers its own
names, its LoRA adapters' and 404 for the rest (fields.known_model)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Protocol, TypeVar

from aiohttp import web

from ..engine.engine import Engine
from ..served_models import Purpose, ServedModels
from .body import parsed_body


class _Named(Protocol):
    @property
    def model(self) -> str | None: ...


B = TypeVar("B", bound=_Named)


class ModelRouter:
    def __init__(self, default: Callable[[], Engine], models: ServedModels) -> None:
        """`default()`: the default model's engine, or a 503 while it loads or the server drains."""
        self.default = default
        self.models = models

    @asynccontextmanager
    async def body(self, request: web.Request, parse: Callable[[Engine], Callable[[object], B]],
                   purpose: Purpose = "generation") -> AsyncIterator[tuple[Engine, B]]:
        """The engine of the model the body names, held for the block (served_models.py),
        and the body as `parse(engine)` reads it: read with the default model's rules first,
        again with the named model's when its tool format differs. A model that does not
        serve the route's `purpose` is a 400 naming `model`."""
        default = self.default()
        body = await parsed_body(request, default, parse(default))
        async with self.models.held(default, body.model, "model", purpose) as engine:
            if engine.tool_format != default.tool_format:
                body = await parsed_body(request, engine, parse(engine))
            yield engine, body
