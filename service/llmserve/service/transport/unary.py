"""Tokenize and Detokenize: a small request is answered on the event loop; a large one
(its whole answer: tokenizing, pieces, the response message) on the engine's offload
pool, whose few threads run at a lower CPU priority than decoding and which refuses
calls past its queue with RESOURCE_EXHAUSTED and a retry hint (`Engine.off_loop`).

Measured before (issue 26): 8 concurrent 4 MB Tokenize calls on asyncio's default
pool stretched a decoding stream's largest gap between tokens to 3.3 s on 2 cores.
"""

from __future__ import annotations

from llmserve.v1 import llmserve_pb2 as pb

from ..engine.engine import Engine
from . import validation

CHARS_PER_ID = 4  # an id's share of the large-work rule: more than 4,096 ids are checked and rendered off the loop


def _tokenize(engine: Engine, request: pb.TokenizeRequest) -> pb.TokenizeResponse:
    model = request.embedding_model
    ids = engine.tokenize(request.text, request.add_special, request.parse_special, model)
    pieces = engine.pieces(ids, model) if request.with_pieces else []
    return pb.TokenizeResponse(ids=ids, pieces=pieces)


def _detokenize(engine: Engine, request: pb.DetokenizeRequest) -> pb.DetokenizeResponse:
    model = request.embedding_model
    ids = validation.token_ids(request.ids, engine.n_vocab(model), "ids")
    return pb.DetokenizeResponse(text=engine.detokenize(ids, request.render_special, model))


async def tokenize(engine: Engine, request: pb.TokenizeRequest) -> pb.TokenizeResponse:
    return await engine.off_loop(len(request.text), _tokenize, engine, request)


async def detokenize(engine: Engine, request: pb.DetokenizeRequest) -> pb.DetokenizeResponse:
    return await engine.off_loop(len(request.ids) * CHARS_PER_ID, _detokenize, engine, request)
