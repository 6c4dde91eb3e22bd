"""`/v1/embeddings`: OpenAI's body → the engine's embedding inputs → OpenAI's list.

It runs as gRPC Embed does (transport/embed_call.py): text is tokenized with the embedding
model's own vocabulary (its BOS/EOS added, special tokens parsed), token ids are checked
against it, each input must fit `max_input_tokens` (one ubatch, and the model's trained
context) or the request is a 400 naming its index; vectors are L2-normalized, as gRPC's
default and OpenAI's. `encoding_format: "base64"` is the vector's little-endian float32
bytes, as OpenAI sends them. A server without `--embeddings` answers 404 (param `model`):
its model does not serve this route.
"""

from __future__ import annotations

import asyncio
import base64
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..domain import request_rules
from ..domain.errors import InvalidRequest
from ..domain.events import EmbedResult, SessionFailed
from ..domain.model_meta import EmbeddingModelInfo
from ..domain.requests import EmbedInput
from ..engine.engine import Engine, LoopSink
from . import fields
from .errors import ApiError, bad_request, from_failure

FIELDS = frozenset({"model", "input", "encoding_format", "dimensions", "user"})
ENCODINGS = ("float", "base64")
MAX_INPUTS = 2048  # OpenAI's limit per request
WINDOW = 256  # inputs queued on the executor at once, as gRPC Embed's read-ahead


@dataclass(frozen=True)
class EmbeddingsRequest:
    model: str | None
    inputs: list[str | list[int]]
    encoding_format: str = "float"
    dimensions: int | None = None


def parse_embeddings(value: object) -> EmbeddingsRequest:
    body = fields.body_of(value, FIELDS)
    if "input" not in body:
        raise bad_request("input is required", "input")
    inputs = fields.texts_or_tokens(body["input"], "input")
    if len(inputs) > MAX_INPUTS:
        raise bad_request(f"at most {MAX_INPUTS} inputs per request, got {len(inputs)}", "input")
    encoding = fields.string(body, "encoding_format") if "encoding_format" in body else "float"
    if encoding not in ENCODINGS:
        raise bad_request(f"encoding_format must be one of {', '.join(ENCODINGS)}, got {encoding!r}", "encoding_format")
    if "user" in body:
        fields.string(body, "user")
    return EmbeddingsRequest(fields.string(body, "model") if "model" in body else None, inputs, encoding,
                             fields.integer(body, "dimensions") if "dimensions" in body else None)


def embedding_model_of(engine: Engine, names: tuple[str, ...]) -> EmbeddingModelInfo:
    """The embedding model, or 404 when the server runs without `--embeddings`."""
    if engine.embedding_model is None:
        raise ApiError(404, f"the model {names[0]!r} does not serve embeddings: this server was started without "
                            "--embeddings (or --embedding-model)", param="model", code="model_not_found")
    return engine.embedding_model


def model_names(embedder: EmbeddingModelInfo, names: tuple[str, ...]) -> tuple[str, ...]:
    """The served model's names, and a separate embedding model's file name and stem."""
    if not embedder.separate:
        return names
    path = Path(embedder.meta.path)
    return (*names, path.stem, path.name)


async def embed(engine: Engine, embedder: EmbeddingModelInfo, request: EmbeddingsRequest,
                model: str) -> bytes:
    """The request's reply body (JSON): its vectors, as gRPC Embed computes them: its texts tokenized off the event
    loop (one offload job: Overloaded, a 429, when that pool is full), at most `WINDOW`
    inputs queued on the executor at a time."""
    if request.dimensions is not None and request.dimensions != embedder.n_embd:
        raise bad_request(f"dimensions must be the model's {embedder.n_embd} (vectors are not shortened), "
                          f"got {request.dimensions}", "dimensions")
    n_vocab = engine.n_vocab(embedding_model=True)
    size = sum(len(item) for item in request.inputs)
    inputs = await asyncio.wrap_future(engine.offload(_all_tokens, engine, request.inputs, n_vocab, size=size))
    results = await _vectors(engine, inputs)
    reply = engine.offload(_reply_json, results, request.encoding_format, model, inputs, may_refuse=False,
                           size=len(inputs) * embedder.n_embd)
    return await asyncio.wrap_future(reply)


def _reply_json(results: dict[int, EmbedResult], encoding: str, model: str, inputs: list[EmbedInput]) -> bytes:
    """OpenAI's list, serialized on the offload pool (2,048 vectors are megabytes of JSON),
    one vector at a time: json.dumps holds the GIL for a whole call, the loop's and the executor's too."""
    data = ",".join(json.dumps({"object": "embedding", "index": i, "embedding": _encoded(results[i].vector, encoding)})
                    for i in range(len(inputs)))
    num_tokens = sum(len(x.tokens) for x in inputs)
    usage = json.dumps({"prompt_tokens": num_tokens, "total_tokens": num_tokens})
    return f'{{"object": "list", "data": [{data}], "model": {json.dumps(model)}, "usage": {usage}}}'.encode()


async def _vectors(engine: Engine, inputs: list[EmbedInput]) -> dict[int, EmbedResult]:
    """Every input's result, with at most WINDOW of them waiting on the executor."""
    sink = LoopSink(asyncio.get_running_loop())
    results: dict[int, EmbedResult] = {}
    num_sent = 0
    try:
        while len(results) < len(inputs):
            if num_sent - len(results) < WINDOW // 2 and num_sent < len(inputs):
                batch = inputs[num_sent:len(results) + WINDOW]
                engine.embed(tuple(batch), sink)
                num_sent += len(batch)
            event = await sink.get()
            if isinstance(event, SessionFailed):
                raise from_failure(event.kind, event.message)
            if isinstance(event, EmbedResult):
                results[event.index] = event
    finally:
        engine.drop_embeds(sink)  # a cancelled request leaves no work behind
    return results


def _all_tokens(engine: Engine, items: list[str | list[int]], n_vocab: int) -> list[EmbedInput]:
    """Each input, tokenized (on the offload pool), or a 400 naming the first that is refused."""
    return [_tokens(engine, item, i, len(items), n_vocab) for i, item in enumerate(items)]


def _tokens(engine: Engine, item: str | list[int], index: int, num_inputs: int, n_vocab: int) -> EmbedInput:
    where = "input" if num_inputs == 1 and isinstance(item, str) else f"input[{index}]"
    if isinstance(item, list):
        tokens = request_rules.token_ids(item, n_vocab, where)
    else:
        tokens = tuple(engine.tokenize(item, True, True, embedding_model=True))
    try:
        return engine.embed_input(index, tokens, where)
    except InvalidRequest as exc:  # too long: a 400 naming it as this body does
        raise bad_request(str(exc), where) from None


def _encoded(vector: np.ndarray, encoding: str) -> list[float] | str:
    if encoding == "base64":
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return np.asarray(vector, dtype=np.float32).tolist()  # in C: the GIL's other holders wait less
