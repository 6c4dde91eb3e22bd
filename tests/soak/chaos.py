"""Chaos client: a seeded mix of everything a client can do to llmserve, on loopback.

    python -m tests.soak.chaos --calls 2000 [--seed 7] [--out docs/reliability.md]

starts its own server (4 slots, --max-queue 4, embeddings, metrics), throws the mix at
it from 8 threads, then checks the server: alive and healthy, every call ended with a
status expected for its kind (each call has a deadline: nothing can hang), every call the
client cancelled or dropped ended CANCELLED on the server (its log and metrics), the valid
calls served (tests/soak/chaos_checks.py), every slot idle with llama.cpp's KV holding
exactly the slots' cached prefixes, no open sessions, RSS and thread counts flat.
`make test` runs a short mode (tests/soak/test_soak.py).
"""

from __future__ import annotations

import argparse
import itertools
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
from llmserve.client import Client, make_input, pb, session_config
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc

from harness.metrics import metric
from harness.server import num_threads, rss_kb, start_server, stop_server
from tests.helpers import SessionStream
from tests.soak.chaos_checks import CancelledCall, ChaosRun, Outcome, cancel_counts, server_findings
from tests.soak.server_state import kv_leaks, wait_until_idle

SERVER_ARGS = ["-np", "4", "-c", "4096", "-t", "2", "--max-queue", "4", "--embeddings"]
CALL_TIMEOUT = 120.0  # a 400-token turn behind a full server on a slow 2-core machine
OK = "OK"
LINGER_S = 1.0  # how long a call the client ended may still hold its place on the server

# kind -> statuses a correct server may answer with
EXPECTED: dict[str, set[str]] = {
    "turn": {OK, "RESOURCE_EXHAUSTED"},
    "multiturn": {OK, "RESOURCE_EXHAUSTED"},
    "cancel_in_band": {OK, "RESOURCE_EXHAUSTED"},
    "cancel_call": {"CANCELLED", "RESOURCE_EXHAUSTED"},
    "deadline": {OK, "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED"},
    "disconnect": {"CANCELLED", "RESOURCE_EXHAUSTED"},
    "stop_reading": {"DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED"},
    "hostile": {"INVALID_ARGUMENT", "RESOURCE_EXHAUSTED"},
    "embed": {OK},
    "embed_oversize": {"INVALID_ARGUMENT"},
    "burst": {OK, "RESOURCE_EXHAUSTED"},
}
WEIGHTS = {
    "turn": 6, "multiturn": 2, "cancel_in_band": 2, "cancel_call": 2, "deadline": 3, "disconnect": 1,
    "stop_reading": 1, "hostile": 3, "embed": 2, "embed_oversize": 1, "burst": 1,
}
PROMPTS = ["Tell me about the sea.", "List some fruits:", "def add(a, b):", "Once upon a time", "Why is the sky blue?"]


def _code(err: grpc.RpcError) -> str:
    return err.code().name  # type: ignore[no-any-return]


class Chaos:
    def __init__(self, address: str) -> None:
        self.address = address
        self.channel = grpc.insecure_channel(address)
        self.stub = pb_grpc.LLMServiceStub(self.channel)
        self.cancelled: list[CancelledCall] = []
        self.refused_with_room: list[str] = []
        with Client(address, timeout=30) as client:
            info = client.model_info()
        self.capacity = info.n_parallel + info.max_queue  # calls admitted at once; more may be refused
        self._in_flight = 0  # calls of this client not yet answered (a burst is its ten turns)
        self._lock = threading.Lock()  # the workers' threads record their cancels and count calls
        run = uuid.uuid4().hex[:8]
        self._ids = (f"chaos-{run}-{i}" for i in itertools.count())

    def run_one(self, kind: str, rng: random.Random) -> list[Outcome]:
        action: Callable[[random.Random], str | list[str]] = getattr(self, "_" + kind)
        calls = kind != "burst"  # a burst's turns count themselves
        with self._lock:
            self._in_flight += calls
            at_start = self._in_flight
        result: str | list[str] = "CLIENT-ERROR interrupted"
        try:
            result = action(rng)
        except grpc.RpcError as err:
            result = _code(err)
            with self._lock:  # a refusal is the server's right only when it was full (then or since)
                if result == "RESOURCE_EXHAUSTED" and max(at_start, self._in_flight) <= self.capacity:
                    self.refused_with_room.append(kind)
        except Exception as exc:  # noqa: BLE001 - recorded as unexpected
            result = f"CLIENT-ERROR {type(exc).__name__}: {exc}"
        finally:
            self._leave(calls, result if isinstance(result, str) else OK)
        statuses = result if isinstance(result, list) else [result]
        return [Outcome(kind, s) for s in statuses]

    def _leave(self, calls: int, status: str) -> None:
        """The call stops counting in flight: at once, or LINGER_S later when the client ended it
        (a cancel, a disconnect, its deadline): the server learns of that a moment after."""
        def leave() -> None:
            with self._lock:
                self._in_flight -= calls
        threading.Timer(LINGER_S, leave).start() if status in ("CANCELLED", "DEADLINE_EXCEEDED") else leave()

    def _call_once(self, request: pb.GenerateRequest, timeout: float = CALL_TIMEOUT) -> str:
        list(self.stub.Generate(iter([request]), timeout=timeout))
        return OK

    def _turn(self, rng: random.Random) -> str:
        config = session_config(max_tokens=rng.randint(1, 24), temperature=rng.choice([0.0, 0.7, 1.2]), seed=rng.randint(0, 99))
        return self._call_once(pb.GenerateRequest(config=config, input=make_input(rng.choice(PROMPTS)), end_of_turn=True))

    def _multiturn(self, rng: random.Random) -> str:
        s = SessionStream(self.channel, timeout=CALL_TIMEOUT, max_tokens=rng.randint(1, 12), temperature=0)
        for _ in range(rng.randint(2, 3)):
            s.send(rng.choice(PROMPTS))
            s.read_turn()
        s.close()
        list(s.call)
        return OK

    def _cancel_in_band(self, rng: random.Random) -> str:
        s = SessionStream(self.channel, timeout=CALL_TIMEOUT, max_tokens=400, ignore_eos=True)
        s.send(rng.choice(PROMPTS))
        for _ in range(rng.randint(0, 4)):
            s.next_response()
        s.cancel()
        end = s.read_turn()[2]
        assert end.finish_reason in (pb.FINISH_REASON_CANCELLED, pb.FINISH_REASON_LENGTH)
        s.send("And now briefly:", end_of_turn=True)
        s.read_turn()
        s.close()
        list(s.call)
        return OK

    def _cancelled_mid_turn(self, kind: str, channel: grpc.Channel, rng: random.Random,
                            cancel: Callable[[SessionStream], None]) -> str:
        """A 400-token turn that the client ends after 0-3 responses; the server's side of it is
        checked after the run (chaos_checks.cancel_findings), by its request id."""
        with self._lock:
            rid = next(self._ids)
        s = SessionStream(channel, timeout=CALL_TIMEOUT, max_tokens=400, ignore_eos=True, request_id=rid)
        s.send(rng.choice(PROMPTS))
        read = rng.randint(0, 3)
        for _ in range(read):
            s.next_response()
        cancel(s)
        with self._lock:
            self.cancelled.append(CancelledCall(kind, rid, read))
        return "CANCELLED"

    def _cancel_call(self, rng: random.Random) -> str:
        return self._cancelled_mid_turn("cancel_call", self.channel, rng, lambda s: s.call.cancel())

    def _deadline(self, rng: random.Random) -> str:
        timeout = rng.choice([0.001, 0.01, 0.05, 0.2, 0.5, 1.0, 2.0])
        config = session_config(max_tokens=64, ignore_eos=True)
        return self._call_once(pb.GenerateRequest(config=config, input=make_input(rng.choice(PROMPTS)), end_of_turn=True), timeout)

    def _disconnect(self, rng: random.Random) -> str:
        channel = grpc.insecure_channel(self.address)
        # the connection goes away mid-stream
        return self._cancelled_mid_turn("disconnect", channel, rng, lambda s: channel.close())

    def _stop_reading(self, rng: random.Random) -> str:
        channel = grpc.insecure_channel(self.address, options=[("grpc.http2.lookahead_bytes", 1024), ("grpc.http2.bdp_probe", 0)])
        try:
            request = pb.GenerateRequest(config=session_config(max_tokens=1000, ignore_eos=True), input=make_input("Count:"), end_of_turn=True)
            call = pb_grpc.LLMServiceStub(channel).Generate(iter([request]), timeout=rng.uniform(0.5, 1.5))
            time.sleep(2.0)  # never reads; the deadline ends it
            next(call)
            for _ in call:
                pass
            return OK
        finally:
            channel.close()

    def _hostile(self, rng: random.Random) -> str:
        choice = rng.randrange(7)
        if choice == 0:
            raw = self.channel.stream_stream("/llmserve.v1.LLMService/Generate")
            list(raw(iter([bytes(rng.randbytes(rng.randint(1, 64)))]), timeout=CALL_TIMEOUT))
            return OK
        config = session_config(max_tokens=4)
        inp = make_input("hello")
        if choice == 1:
            inp = make_input([2, rng.choice([-5, 262144, 2**31 - 1])])
        elif choice == 2:
            config.sampling.temperature = rng.choice([float("nan"), float("inf"), -3.0])
        elif choice == 3:
            config.stopping.stop.extend(["x"] * 40)
        elif choice == 4:
            config.constraint.grammar = "root ::= ((("
        elif choice == 5:
            inp = make_input("")
        else:
            config.stopping.max_tokens = 10**7
        return self._call_once(pb.GenerateRequest(config=config, input=inp, end_of_turn=True))

    def _embed(self, rng: random.Random) -> str:
        texts = [f"{rng.choice(PROMPTS)} {i}" for i in range(rng.randint(1, 40))]
        got = list(self.stub.Embed(iter([pb.EmbedRequest(inputs=[pb.Input(text=t) for t in texts])]), timeout=CALL_TIMEOUT))
        assert [r.index for r in got] == list(range(len(texts)))
        return OK

    def _embed_oversize(self, rng: random.Random) -> str:
        request = pb.EmbedRequest(inputs=[pb.Input(text="ok"), make_input([2] + [1000] * 3000)])
        list(self.stub.Embed(iter([request]), timeout=CALL_TIMEOUT))
        return OK

    def _burst(self, rng: random.Random) -> list[str]:
        with ThreadPoolExecutor(10) as pool:
            return list(pool.map(lambda _: self.run_one("turn", random.Random(rng.random()))[0].status, range(10)))


def run_chaos(address: str, calls: int, seed: int, workers: int = 8) -> ChaosRun:
    rng = random.Random(seed)
    kinds = rng.choices(list(WEIGHTS), weights=list(WEIGHTS.values()), k=calls)
    seeds = [rng.random() for _ in kinds]
    chaos = Chaos(address)
    with ThreadPoolExecutor(workers) as pool:
        results = pool.map(lambda ks: chaos.run_one(ks[0], random.Random(ks[1])), zip(kinds, seeds))
        outcomes: Counter[Outcome] = Counter(o for batch in results for o in batch)
    chaos.channel.close()
    return ChaosRun(outcomes, chaos.cancelled, chaos.refused_with_room)


def unexpected(outcomes: Counter[Outcome]) -> dict[Outcome, int]:
    return {o: n for o, n in outcomes.items() if o.status not in EXPECTED[o.kind]}


def report(outcomes: Counter[Outcome], calls: int, seed: int, extra: list[str]) -> str:
    kinds = sorted({o.kind for o in outcomes})
    statuses = sorted({o.status for o in outcomes})
    lines = ["| kind | " + " | ".join(statuses) + " | expected |", "|---|" + "---|" * (len(statuses) + 1)]
    for kind in kinds:
        cells = [str(outcomes.get(Outcome(kind, s), "")) for s in statuses]
        lines.append(f"| {kind} | " + " | ".join(cells) + f" | {', '.join(sorted(EXPECTED[kind]))} |")
    return (
        f"{calls} calls, seed {seed} (`python -m tests.soak.chaos --calls {calls} --seed {seed}`):\n\n"
        + "\n".join(lines) + "\n\n" + "\n".join(f"* {e}" for e in extra) + "\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    log = Path("/tmp/llmserve-soak.log")
    server = start_server(SERVER_ARGS, log, metrics=True)
    try:
        half = args.calls // 2
        before = cancel_counts(server.metrics_port)
        first = run_chaos(server.address, half, args.seed)
        wait_until_idle(server.address)
        rss_mid, threads_mid = rss_kb(server.process.pid), num_threads(server.process.pid)
        second = run_chaos(server.address, args.calls - half, args.seed + 1)
        info = wait_until_idle(server.address)
        rss_end, threads_end = rss_kb(server.process.pid), num_threads(server.process.pid)
        run = ChaosRun(first.outcomes + second.outcomes, first.cancelled + second.cancelled,
                       first.refused_with_room + second.refused_with_room)
        outcomes = run.outcomes
        bad = unexpected(outcomes)
        findings = server_findings(run, log, server.metrics_port, before)
        leaks = kv_leaks(info)
        open_sessions = metric(server.metrics_port, "llmserve_sessions")
        extra = [
            f"unexpected statuses: {bad or 'none'}",
            f"the server's side ({len(run.cancelled)} calls cancelled or dropped by the client; the valid calls "
            f"served): {findings or 'clean'}",
            f"KV check after the run (llama_memory_seq_pos_min/max per slot vs cached prefix): {leaks or 'clean'}",
            f"open sessions after the run: {open_sessions:.0f}",
            f"server RSS after the first half {rss_mid / 1024:.1f} MiB, after the second {rss_end / 1024:.1f} MiB "
            f"({100 * (rss_end - rss_mid) / rss_mid:+.1f}%)",
            f"server threads after the first half {threads_mid}, after the second {threads_end}",
            f"server still healthy: {server.process.poll() is None}",
        ]
    finally:
        code = stop_server(server)
    extra.append(f"server exit code after SIGTERM: {code}")
    text = report(outcomes, args.calls, args.seed, extra)
    print(text)
    if args.out:
        body = args.out.read_text().split("<!-- soak -->")[0] if args.out.exists() else ""
        args.out.write_text(body + "<!-- soak -->\n" + text)
    if bad or findings or leaks:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
