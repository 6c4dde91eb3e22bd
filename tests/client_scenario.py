"""The scenario every generated client (Go, C++, Java, TypeScript) runs, and its check.

Each client program reads the server address from LLMSERVE_ADDRESS and prints one JSON
object per line, in this order (docs/clients.md):

  {"step": "model_info", "name": str, "n_ctx": int, "embedding_dim": int}
      GetModelInfo; embedding_dim = embedding_model.n_embd.
  {"step": "turn", "turn": 1|2, "chunks": int, "text": str, "finish_reason": str,
   "prompt_tokens": int, "cached_tokens": int, "completion_tokens": int}
      One bidi Generate stream, two turns. First message: config {sampling
      {temperature 0}, stopping {max_tokens 12}} + input TURN_1 + end_of_turn; read
      chunks until the TurnEnd; then input TURN_2 + end_of_turn on the same stream;
      then half-close and read to the end (status OK).
  {"step": "cancel", "finish_reason": str, "completion_tokens": int}
      A second stream: config {stopping {max_tokens 400, ignore_eos true}}, input
      CANCEL_PROMPT + end_of_turn; after the first chunk, send {cancel: true}; read to
      the TurnEnd; half-close.
  {"step": "embed", "count": int, "dims": [int], "indices": [int]}
      One Embed stream: one message with the three EMBED_TEXTS; one result each.
  {"step": "bad_request", "code": str, "field": str, "description": str}
      A Generate stream whose first message has stopping {max_tokens -1} (and input
      "Hi" + end_of_turn): the call fails; `code` is the status code's name
      ("INVALID_ARGUMENT") and field/description come from the google.rpc.BadRequest
      decoded from the status details (grpc-status-details-bin).

The program exits 0 when every step ran; the values are checked here, against what the
Python stubs get from the same server.
"""

from __future__ import annotations

import json
from typing import Any

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from llmserve.client import make_input, pb, session_config
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc

TURN_1 = "The three primary colours are"
TURN_2 = " And the three secondary colours are"
CANCEL_PROMPT = "Write a very long story about a lighthouse keeper."
EMBED_TEXTS = ("a red apple", "a green pear", "the stock market fell today")
STEPS = ("model_info", "turn", "turn", "cancel", "embed", "bad_request")


def parse(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def python_bad_request(address: str) -> tuple[str, str]:
    """(field, description) of the BadRequest the Python stubs get for the bad request."""
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.LLMServiceStub(channel)
        first = pb.GenerateRequest(config=session_config(max_tokens=-1), input=make_input("Hi"), end_of_turn=True)
        try:
            list(stub.Generate(iter([first]), timeout=30))
        except grpc.RpcError as err:
            status = rpc_status.from_call(err)  # type: ignore[arg-type]
            violation = error_details_pb2.BadRequest()
            assert status is not None and any(d.Unpack(violation) for d in status.details)
            return violation.field_violations[0].field, violation.field_violations[0].description
    raise AssertionError("max_tokens -1 was accepted")


def check(stdout: str, address: str) -> dict[str, Any]:
    """Assert the client's printed steps; returns them by name (turns as turn1/turn2)."""
    steps = parse(stdout)
    assert [s["step"] for s in steps] == list(STEPS), stdout
    info, turn1, turn2, cancel, embed, bad = steps
    with grpc.insecure_channel(address) as channel:
        expected = pb_grpc.LLMServiceStub(channel).GetModelInfo(pb.GetModelInfoRequest(), timeout=30)
    assert info["name"] == expected.name and info["n_ctx"] == expected.n_ctx
    assert info["embedding_dim"] == expected.embedding_model.n_embd > 0
    for turn in (turn1, turn2):
        assert turn["chunks"] >= 2 and turn["text"], turn  # streamed, not one blob
        assert turn["finish_reason"] in ("FINISH_REASON_LENGTH", "FINISH_REASON_STOP"), turn
        assert 0 < turn["completion_tokens"] <= 12
    # Turn 2 prefills only its own tokens: turn 1's prompt and reply are cached.
    assert turn2["cached_tokens"] >= turn1["prompt_tokens"] > 0, (turn1, turn2)
    assert cancel["finish_reason"] == "FINISH_REASON_CANCELLED"
    assert 0 < cancel["completion_tokens"] < 400
    assert embed["count"] == len(EMBED_TEXTS) and embed["indices"] == [0, 1, 2]
    assert embed["dims"] == [expected.embedding_model.n_embd] * len(EMBED_TEXTS)
    field, description = python_bad_request(address)
    assert bad["code"] == "INVALID_ARGUMENT"
    assert (bad["field"], bad["description"]) == (field, description)
    return {"model_info": info, "turn1": turn1, "turn2": turn2, "cancel": cancel, "embed": embed, "bad_request": bad}
