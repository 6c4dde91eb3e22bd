"""Turning an `Input` message into token ids (text is tokenized, ids are checked)."""

from __future__ import annotations

from llmserve.v1 import llmserve_pb2 as pb

from . import validation
from .errors import InvalidArgument
from .vocab import Vocab


def input_tokens(tokenizer: Vocab, msg: pb.Input, field: str, add_special: bool) -> tuple[int, ...]:
    """Text is tokenized with `tokenizer` (the model the input is for); ids are checked against its vocabulary."""
    kind = msg.WhichOneof("kind")
    if kind == "text":
        if not msg.text:
            raise InvalidArgument("text input must not be empty", field=f"{field}.text")
        return tuple(tokenizer.tokenize(msg.text, add_special=add_special, parse_special=True))
    if kind == "tokens":
        if not msg.tokens.ids:
            raise InvalidArgument("token input must not be empty", field=f"{field}.tokens.ids")
        return validation.token_ids(msg.tokens.ids, tokenizer.n_tokens, f"{field}.tokens.ids")
    raise InvalidArgument("input must hold text or tokens", field=field)
