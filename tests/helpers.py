"""Test helpers: a multi-turn Generate session over the sync gRPC API."""

from __future__ import annotations

import queue
import threading
import time
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


class DecodingStream:
    """A gRPC stream that decodes until stopped; the time of every chunk it gets (a
    flood's effect on other clients is its longest gap)."""

    def __init__(self, stub: pb_grpc.LLMServiceStub, max_tokens: int = 3500) -> None:
        self._max_tokens = max_tokens
        self._stop = threading.Event()
        self.times: list[float] = []
        self._call = stub.Generate(self._requests(), timeout=600)
        self._reader = threading.Thread(target=self._read)
        self._reader.start()
        deadline = time.monotonic() + 60
        while not self.times:
            assert self._reader.is_alive() and time.monotonic() < deadline, "the stream did not start"
            time.sleep(0.01)

    def _requests(self) -> Iterator[pb.GenerateRequest]:
        config = session_config(max_tokens=self._max_tokens, ignore_eos=True)
        yield pb.GenerateRequest(config=config, input=make_input("Count to ten thousand:"), end_of_turn=True)
        self._stop.wait()

    def _read(self) -> None:
        try:
            for response in self._call:
                if response.HasField("chunk"):
                    self.times.append(time.monotonic())
        except grpc.RpcError:
            pass

    def max_gap(self, start: float, end: float) -> float:
        """The longest time without a chunk from `start` to `end`, counting from the chunk
        before `start` to the one after `end` (inf when the stream got none after `end`)."""
        before = [t for t in self.times if t < start][-1:]
        after = [t for t in self.times if t > end][:1]
        window = before + [t for t in self.times if start <= t <= end] + after
        if not after:
            return float("inf")
        return max(b - a for a, b in zip(window, window[1:]))

    def stop(self) -> None:
        self._stop.set()
        self._call.cancel()
        self._reader.join()
