"""LoRA adapters over HTTP (translation only: the rules are the engine's AdapterRegistry).

A request picks adapters vLLM's way (`model` = an adapter's name) or llama-server's
(`lora: [{"id": 0, "scale": 0.5}]`, ids from `GET /lora-adapters`; `{"name": ...}` is
taken too). `POST /v1/load_lora_adapter` and `/v1/unload_lora_adapter` take vLLM's bodies
(`lora_name`, `lora_path`) and answer as vLLM does (200 with a line of text).
"""

from __future__ import annotations

import math
from typing import Any

from aiohttp import web

from ..domain.requests import AdapterSet
from ..engine.engine import Engine
from . import fields
from .body import parsed_body
from .errors import ApiError, bad_request

LoraRef = tuple[int | str, float | None]  # an adapter's id or name, and a scale (None: the adapter's own)
MAX_LORA_ENTRIES = 16


def lora_field(value: object) -> tuple[LoraRef, ...]:
    """llama-server's per-request `lora` list, checked for shape (names are resolved later)."""
    if not isinstance(value, list) or len(value) > MAX_LORA_ENTRIES:
        raise bad_request(f"lora must be a list of at most {MAX_LORA_ENTRIES} {{id, scale}} objects", "lora")
    refs = []
    for i, entry in enumerate(value):
        if not isinstance(entry, dict) or set(entry) - {"id", "name", "scale"} or ("id" in entry) == ("name" in entry):
            raise bad_request(f"lora[{i}] must be an object with an id (or a name) and an optional scale", f"lora[{i}]")
        ref = entry.get("id", entry.get("name"))
        if isinstance(ref, bool) or not isinstance(ref, (int, str)):
            raise bad_request(f"lora[{i}].id must be an integer (a name: a string)", f"lora[{i}]")
        scale = entry.get("scale")
        if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))
                                  or not math.isfinite(scale)):
            raise bad_request(f"lora[{i}].scale must be a number", f"lora[{i}].scale")
        refs.append((ref, None if scale is None else float(scale)))
    return tuple(refs)


def model_and_adapters(engine: Engine, model: str | None, lora: tuple[LoraRef, ...],
                       names: tuple[str, ...]) -> tuple[str, AdapterSet]:
    """The reply's `model` and the session's adapters: `model` names the base (404 when it
    names nothing served) or an adapter; `lora` adds adapters by id or name."""
    registry = engine.adapters
    pairs: list[tuple[str, float | None]] = []
    if model is not None and model in registry:
        pairs.append((model, None))
    else:
        model = fields.known_model(model, names)
    for ref, scale in lora:
        name = registry.by_id(ref) if isinstance(ref, int) else ref
        if name is None:
            raise bad_request(f"no LoRA adapter has id {ref} (GET /lora-adapters lists them)", "lora")
        pairs.append((name, scale))
    return model, registry.resolve(pairs, "lora")


def model_entries(engine: Engine, base: str, created: int) -> list[dict[str, Any]]:
    """The adapters in `/v1/models`, as vLLM lists them (a model whose parent is the base)."""
    return [{"id": info.name, "object": "model", "created": created, "owned_by": "llmserve", "root": info.path,
             "parent": base} for info in engine.adapters.listing()]


def lora_adapters(engine: Engine) -> list[dict[str, Any]]:
    """llama-server's `GET /lora-adapters` (an aLoRA with its invocation, as llama-server lists it)."""
    return [{"id": info.id, "path": info.path, "scale": info.scale, "name": info.name, "state": info.state,
             **_invocation(engine, info.invocation_tokens)} for info in engine.adapters.listing()]


def _invocation(engine: Engine, tokens: tuple[int, ...]) -> dict[str, Any]:
    if not tokens:
        return {}
    return {"alora_invocation_string": engine.detokenize(tokens, render_special=True),
            "alora_invocation_tokens": list(tokens)}


async def load(engine: Engine, request: web.Request) -> web.Response:
    body = await parsed_body(request, engine, lambda value: _fields(value, ("lora_name", "lora_path"), ("scale",)))
    scale = fields.number(body, "scale") if "scale" in body else None
    await engine.load_adapter(body["lora_name"], body["lora_path"], scale)
    return web.Response(text=f"Success: LoRA adapter '{body['lora_name']}' added successfully.")


async def unload(engine: Engine, request: web.Request) -> web.Response:
    body = await parsed_body(request, engine, lambda value: _fields(value, ("lora_name",)))
    freed = await engine.adapters.unload(body["lora_name"])
    later = "" if freed else " (it is freed when the sessions running under it end)"
    return web.Response(text=f"Success: LoRA adapter '{body['lora_name']}' removed successfully.{later}")


def _fields(value: object, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict[str, Any]:
    body = fields.body_of(value, required + optional)
    for name in required:
        if not isinstance(body.get(name), str) or not body[name]:
            raise ApiError(400, f"{name} is required (a string)", param=name)
    return body
