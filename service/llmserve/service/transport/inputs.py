"""Turning an `Input` message into token ids (text is tokenized, ids are checked)."""

from __future__ import annotations

from llmserve.v1 import llmserve_pb2 as pb

from ..engine.engine import Engine
from . import validation
from .errors import InvalidArgument


async def input_tokens(
    engine: Engine, msg: pb.Input, field: str, add_special: bool, embedding_model: bool = False
) -> tuple[int, ...]:
    """Text is tokenized with the vocabulary of the model the input is for (the embedding
    model's when `embedding_model`); ids are checked against it."""
    kind = msg.WhichOneof("kind")
    if kind == "text":
        if not msg.text:
            raise InvalidArgument("text input must not be empty", field=f"{field}.text")
        return await engine.tokenize_async(msg.text, add_special, True, embedding_model)
    if kind == "tokens":
        if not msg.tokens.ids:
            raise InvalidArgument("token input must not be empty", field=f"{field}.tokens.ids")
        return validation.token_ids(msg.tokens.ids, engine.n_vocab(embedding_model), f"{field}.tokens.ids")
    raise InvalidArgument("input must hold text or tokens", field=field)
