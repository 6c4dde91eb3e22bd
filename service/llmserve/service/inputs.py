"""Turning an `Input` message into token ids (text is tokenized, ids are checked)."""

from __future__ import annotations

from llmserve.v1 import llmserve_pb2 as pb

from . import validation
from .engine import Engine
from .errors import InvalidArgument


def input_tokens(engine: Engine, msg: pb.Input, field: str, add_bos: bool) -> tuple[int, ...]:
    kind = msg.WhichOneof("kind")
    if kind == "text":
        if not msg.text:
            raise InvalidArgument("text input must not be empty", field=f"{field}.text")
        return tuple(engine.runner.tokenize(msg.text, add_special=add_bos, parse_special=True))
    if kind == "tokens":
        if not msg.tokens.ids:
            raise InvalidArgument("token input must not be empty", field=f"{field}.tokens.ids")
        return validation.token_ids(msg.tokens.ids, engine.limits, f"{field}.tokens.ids")
    raise InvalidArgument("input must hold text or tokens", field=field)
