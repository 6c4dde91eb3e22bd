"""Test helpers: a multi-turn Generate session over the sync gRPC API."""

from __future__ import annotations

import queue
from collections.abc import Iterator, Sequence

import grpc
from llmserve.client import make_input, pb, session_config
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc

_END = object()


class SessionStream:
    """One Generate stream: send input and turn ends, read turns back."""

    def __init__(self, channel: grpc.Channel, timeout: float = 120, **config: object) -> None:
        self._requests: queue.Queue[object] = queue.Queue()
        self._requests.put(pb.GenerateRequest(config=session_config(**config)))  # type: ignore[arg-type]
        self.call = pb_grpc.LLMServiceStub(channel).Generate(self._iter(), timeout=timeout)
        self._responses: Iterator[pb.GenerateResponse] = iter(self.call)
        self.turn_logprobs: list[pb.TokenLogprob] = []  # the last turn's, when asked (top_logprobs)

    def _iter(self) -> Iterator[pb.GenerateRequest]:
        while True:
            item = self._requests.get()
            if item is _END:
                return
            yield item  # type: ignore[misc]

    def send(self, prompt: str | Sequence[int] | pb.Input | None = None, end_of_turn: bool = True) -> None:
        request = pb.GenerateRequest(end_of_turn=end_of_turn)
        if isinstance(prompt, pb.Input):
            request.input.CopyFrom(prompt)
        elif prompt is not None:
            request.input.CopyFrom(make_input(prompt))
        self._requests.put(request)

    def cancel(self) -> None:
        self._requests.put(pb.GenerateRequest(cancel=True))

    def close(self) -> None:
        self._requests.put(_END)

    def next_response(self) -> pb.GenerateResponse:
        return next(self._responses)

    def read_turn(self) -> tuple[str, list[int], pb.TurnEnd]:
        """The next turn's text, token ids and end; its logprobs (if asked) go to `turn_logprobs`."""
        text: list[str] = []
        ids: list[int] = []
        self.turn_logprobs = []
        for response in self._responses:
            if response.HasField("chunk"):
                text.append(response.chunk.text)
                ids.extend(response.chunk.token_ids)
                self.turn_logprobs.extend(response.chunk.logprobs)
            else:
                return "".join(text), ids, response.turn_end
        raise AssertionError("stream ended before the turn end")
