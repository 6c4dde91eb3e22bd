"""Heavy unary work must not starve decoding (issue 26 part 4).

Before: 8 concurrent multi-megabyte Tokenize calls (each on asyncio's default pool, at
the executor's priority) stretched a decoding stream's largest gap between tokens to
3.3 s on 2 cores. Now they run one at a time on a low-priority thread, and calls past
its queue are RESOURCE_EXHAUSTED with a retry hint.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, wait

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from llmserve.client import pb
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc

from harness.server import RunningServer, start_server, stop_server
from tests.helpers import DecodingStream

OPTIONS = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]
TEXT_4MB = ("The committee reviewed the proposal and postponed the vote until next week. " * 60_000)[: 4 << 20]
MAX_GAP_S = 1.0  # the bound the issue sets; a decode step of this model takes ~15-40 ms here
WINDOW_S = 12.0  # the gaps are measured until the calls are answered, at most this long
# The stream must outlast the window: 3,500 tokens ended inside a 20 s one on a quiet machine
# (decoding ~170 tokens/s, the 8 calls not answered yet), leaving no chunk after it (gap inf).
STREAM_TOKENS = 7000


@pytest.fixture(scope="module")
def heavy_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    args = ["-np", "2", "-c", "16384", "-t", "2", "--max-message-bytes", str(32 << 20)]  # 8,192 per slot
    running = start_server(args, tmp_path_factory.mktemp("heavy") / "server.log")
    yield running
    assert stop_server(running) == 0


def _tokenize(stub: pb_grpc.LLMServiceStub, text: str = TEXT_4MB) -> tuple[grpc.StatusCode, int, float | None]:
    """(status, number of ids, retry hint in seconds)."""
    try:
        reply = stub.Tokenize(pb.TokenizeRequest(text=text), timeout=300)
        return grpc.StatusCode.OK, len(reply.ids), None
    except grpc.RpcError as err:
        retry = None
        for detail in rpc_status.from_call(err).details if err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED else ():
            info = error_details_pb2.RetryInfo()
            if detail.Unpack(info):
                retry = info.retry_delay.ToTimedelta().total_seconds()
        return err.code(), 0, retry


def test_eight_4mb_tokenize_calls_keep_a_decoding_stream_under_a_second(heavy_server: RunningServer) -> None:
    """The stream's gaps are measured while the calls are in the server (the first WINDOW_S
    seconds); then the stream stops and the calls must all succeed."""
    with grpc.insecure_channel(heavy_server.address, options=OPTIONS) as channel:
        stub = pb_grpc.LLMServiceStub(channel)
        stream = DecodingStream(stub, max_tokens=STREAM_TOKENS)
        time.sleep(1.0)
        quiet = stream.max_gap(time.monotonic() - 1.0, time.monotonic() - 0.3)
        with ThreadPoolExecutor(8) as pool:
            started = time.monotonic()
            calls = [pool.submit(_tokenize, stub) for _ in range(8)]
            done = wait(calls, timeout=WINDOW_S).done
            ended = time.monotonic()
            time.sleep(0.5)  # the chunk after `ended` closes the last gap
            stream.stop()
            results = [call.result(timeout=600) for call in calls]
    gap = stream.max_gap(started, ended)
    print(f"8 x 4 MB Tokenize: decoding stream's max gap {gap * 1000:.0f} ms over {ended - started:.1f} s "
          f"({len(done)} calls done by then; alone {quiet * 1000:.0f} ms)")
    assert [code for code, _, _ in results] == [grpc.StatusCode.OK] * 8
    assert all(n > 500_000 for _, n, _ in results)
    assert ended - started > 1.0 and gap < MAX_GAP_S


def test_heavy_calls_past_the_queue_are_resource_exhausted_with_a_retry_hint(heavy_server: RunningServer) -> None:
    with grpc.insecure_channel(heavy_server.address, options=OPTIONS) as channel:
        stub = pb_grpc.LLMServiceStub(channel)
        with ThreadPoolExecutor(16) as pool:
            results = list(pool.map(lambda _: _tokenize(stub, TEXT_4MB[: 1 << 20]), range(16)))
        codes = [code for code, _, _ in results]
        assert set(codes) == {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}, codes
        assert codes.count(grpc.StatusCode.OK) >= 9  # one running plus 8 waiting
        assert all(retry is not None and retry > 0 for code, _, retry in results if code != grpc.StatusCode.OK)
        small = stub.Tokenize(pb.TokenizeRequest(text="hello"), timeout=10)  # small calls never wait in line
        assert small.ids
