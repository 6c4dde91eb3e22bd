"""Test helpers over the sync gRPC API: one Generate call and its reply, a multi-turn Generate
session, a stream that decodes until stopped, the slots' state; and `buf curl`, cosine similarity."""

from __future__ import annotations

import queue
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence

import grpc
import numpy as np
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from llmserve.client import Client, make_input, pb, session_config
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc

from harness.server import ROOT

BUF = ROOT / "node_modules/.bin/buf"

_END = object()


def field_of(err: grpc.RpcError) -> str:
    """The field a refused call names (its status's BadRequest detail; "" if none)."""
    status = rpc_status.from_call(err)  # type: ignore[arg-type]
    assert status is not None
    for detail in status.details:
        bad = error_details_pb2.BadRequest()
        if detail.Unpack(bad):
            return bad.field_violations[0].field
    return ""


def generate(address: str, *requests: pb.GenerateRequest, timeout: float = 60) -> Responses:
    """One Generate call sending `requests` on a channel of its own: every response."""
    with grpc.insecure_channel(address) as channel:
        return list(pb_grpc.LLMServiceStub(channel).Generate(iter(requests), timeout=timeout))


Responses = list[pb.GenerateResponse]


def generate_turn(address: str, config: pb.SessionConfig, prompt: str, timeout: float = 60) -> Responses:
    """One Generate call of one turn: `config`, then `prompt` with its end of turn."""
    return generate(address, pb.GenerateRequest(config=config, input=make_input(prompt), end_of_turn=True),
                    timeout=timeout)


def generate_constrained(address: str, constraint: pb.Constraint, seed: int = 1, max_tokens: int = 120,
                         prompt: str = "Describe a person as JSON:", ignore_eos: bool = False) -> Responses:
    """One sampled turn (temperature 0.8) under `constraint`."""
    config = pb.SessionConfig(
        sampling=pb.SamplingParams(temperature=0.8, seed=seed),
        stopping=pb.StoppingCriteria(max_tokens=max_tokens, ignore_eos=ignore_eos),
        constraint=constraint,
    )
    return generate_turn(address, config, prompt, timeout=120)


def reply_text(responses: Responses, index: int | None = None) -> str:
    """The reply's text (`index`: one sample's only)."""
    return "".join(r.chunk.text for r in responses if r.HasField("chunk") and index in (None, r.chunk.index))


def reply_ids(responses: Responses, index: int | None = None) -> list[int]:
    """The reply's token ids (`index`: one sample's only)."""
    return [t for r in responses if r.HasField("chunk") and index in (None, r.chunk.index) for t in r.chunk.token_ids]


def busy_slots(client: Client) -> int:
    return sum(slot.busy for slot in client.model_info().slots)


def wait_paused(client: Client, n: int, timeout: float, what: str = "the unread streams") -> None:
    """Until `n` slots are held by paused sessions (their readers stopped reading)."""
    deadline = time.monotonic() + timeout
    while sum(s.paused for s in client.model_info().slots) < n:
        assert time.monotonic() < deadline, f"{what} were never paused"
        time.sleep(0.05)


def buf_curl(*args: str) -> str:
    """`buf curl` over gRPC (HTTP/2 without TLS) with `args`: its output."""
    assert BUF.exists() or shutil.which("buf"), "buf is installed by `make tools` (npm @bufbuild/buf)"
    cmd = [str(BUF if BUF.exists() else "buf"), "curl", "--protocol", "grpc", "--http2-prior-knowledge", *args]
    return subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=60).stdout


def cosine(a: object, b: object) -> float:
    va, vb = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(va @ vb / (np.linalg.norm(va) * np.linalg.norm(vb)))


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
        self.turn_ended_at: float | None = None  # the turn's end: a gap after it is the test's fault
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
                elif response.HasField("turn_end"):
                    self.turn_ended_at = time.monotonic()
        except grpc.RpcError:
            pass

    def max_gap(self, start: float, end: float) -> float:
        """The longest time without a chunk from `start` to `end`, counting from the chunk
        before `start` to the one after `end` (inf when the stream got none after `end`).
        A turn that ended before `end` is the measuring's fault, not the server's: it raises."""
        assert self.turn_ended_at is None or self.turn_ended_at > end, (
            f"the stream's turn ended {end - self.turn_ended_at:.1f} s before the measured window: "
            f"{len(self.times)} chunks; give it more tokens")
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
