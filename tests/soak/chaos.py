"""Chaos client: a seeded mix of everything a client can do to llmserve, on loopback.

    python -m tests.soak.chaos --calls 2000 [--seed 7] [--out docs/reliability.md]

starts its own server (4 slots, --max-queue 4, embeddings, metrics), throws the mix at
it from 8 threads, then checks the server: alive and healthy, every call ended with a
status expected for its kind (each call has a deadline: nothing can hang), every slot
idle with llama.cpp's KV holding exactly the slots' cached prefixes, no open sessions,
RSS and thread counts flat. `make test` runs a short mode (tests/soak/test_soak.py).
"""

from __future__ import annotations

import argparse
import random
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc
from llmserve.client import Client, make_input, pb, session_config
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc

from tests.helpers import SessionStream

SERVER_ARGS = ["-np", "4", "-c", "4096", "-t", "2", "--max-queue", "4", "--embeddings"]
CALL_TIMEOUT = 120.0  # a 400-token turn behind a full server on a slow 2-core machine
OK = "OK"

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


@dataclass(frozen=True)
class Outcome:
    kind: str
    status: str


def _code(err: grpc.RpcError) -> str:
    return err.code().name  # type: ignore[no-any-return]


class Chaos:
    def __init__(self, address: str) -> None:
        self.address = address
        self.channel = grpc.insecure_channel(address)
        self.stub = pb_grpc.LLMServiceStub(self.channel)

    def run_one(self, kind: str, rng: random.Random) -> list[Outcome]:
        action: Callable[[random.Random], str | list[str]] = getattr(self, "_" + kind)
        try:
            result = action(rng)
        except grpc.RpcError as err:
            result = _code(err)
        except Exception as exc:  # noqa: BLE001 - recorded as unexpected
            result = f"CLIENT-ERROR {type(exc).__name__}: {exc}"
        statuses = result if isinstance(result, list) else [result]
        return [Outcome(kind, s) for s in statuses]

    def _generate(self, request: pb.GenerateRequest, timeout: float = CALL_TIMEOUT) -> str:
        list(self.stub.Generate(iter([request]), timeout=timeout))
        return OK

    def _turn(self, rng: random.Random) -> str:
        config = session_config(max_tokens=rng.randint(1, 24), temperature=rng.choice([0.0, 0.7, 1.2]), seed=rng.randint(0, 99))
        return self._generate(pb.GenerateRequest(config=config, input=make_input(rng.choice(PROMPTS)), end_of_turn=True))

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

    def _cancel_call(self, rng: random.Random) -> str:
        s = SessionStream(self.channel, timeout=CALL_TIMEOUT, max_tokens=400, ignore_eos=True)
        s.send(rng.choice(PROMPTS))
        for _ in range(rng.randint(0, 3)):
            s.next_response()
        s.call.cancel()
        return "CANCELLED"

    def _deadline(self, rng: random.Random) -> str:
        timeout = rng.choice([0.001, 0.01, 0.05, 0.2, 0.5, 1.0, 2.0])
        config = session_config(max_tokens=64, ignore_eos=True)
        return self._generate(pb.GenerateRequest(config=config, input=make_input(rng.choice(PROMPTS)), end_of_turn=True), timeout)

    def _disconnect(self, rng: random.Random) -> str:
        channel = grpc.insecure_channel(self.address)
        s = SessionStream(channel, timeout=CALL_TIMEOUT, max_tokens=400, ignore_eos=True)
        s.send(rng.choice(PROMPTS))
        for _ in range(rng.randint(0, 3)):
            s.next_response()
        channel.close()  # the connection goes away mid-stream
        return "CANCELLED"

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
        return self._generate(pb.GenerateRequest(config=config, input=inp, end_of_turn=True))

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


def run_chaos(address: str, calls: int, seed: int, workers: int = 8) -> Counter[Outcome]:
    rng = random.Random(seed)
    kinds = rng.choices(list(WEIGHTS), weights=list(WEIGHTS.values()), k=calls)
    seeds = [rng.random() for _ in kinds]
    chaos = Chaos(address)
    with ThreadPoolExecutor(workers) as pool:
        results = pool.map(lambda ks: chaos.run_one(ks[0], random.Random(ks[1])), zip(kinds, seeds))
        outcomes: Counter[Outcome] = Counter(o for batch in results for o in batch)
    chaos.channel.close()
    return outcomes


def unexpected(outcomes: Counter[Outcome]) -> dict[Outcome, int]:
    return {o: n for o, n in outcomes.items() if o.status not in EXPECTED[o.kind]}


def wait_until_idle(address: str, timeout: float = 30.0) -> pb.ModelInfo:
    deadline = time.monotonic() + timeout
    with Client(address, timeout=10) as client:
        while True:
            info = client.model_info()
            if not any(s.busy for s in info.slots) and info.num_sessions_waiting == 0:
                return info
            assert time.monotonic() < deadline, "slots still busy after the run"
            time.sleep(0.1)


def kv_leaks(info: pb.ModelInfo) -> list[str]:
    """Slots whose llama.cpp KV does not hold exactly their cached prefix: every position up
    to the last, and from the first one the next token's sliding window reads (`n_swa`)."""
    problems = []
    for s in info.slots:
        n = s.num_cached_tokens
        first_needed = max(0, n - info.n_swa + 1) if info.n_swa else 0
        if s.kv_pos_max != n - 1 or (n and not 0 <= s.kv_pos_min <= first_needed):
            problems.append(f"slot {s.seq_id}: {s.num_cached_tokens} cached tokens, KV positions {s.kv_pos_min}..{s.kv_pos_max}")
    return problems


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def num_threads(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/task").iterdir()))


def metric(port: int, sample: str) -> float:
    """A sample's value; a name /metrics does not have (renamed, removed) raises."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(sample + " "):
                return float(line.split()[-1])
    raise LookupError(f"no metric sample {sample!r} in /metrics")


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
    from tests.conftest import start_server, stop_server

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    log = Path("/tmp/llmserve-soak.log")
    server = start_server(SERVER_ARGS, log, metrics=True)
    try:
        half = args.calls // 2
        first = run_chaos(server.address, half, args.seed)
        wait_until_idle(server.address)
        rss_mid, threads_mid = rss_kb(server.process.pid), num_threads(server.process.pid)
        second = run_chaos(server.address, args.calls - half, args.seed + 1)
        info = wait_until_idle(server.address)
        rss_end, threads_end = rss_kb(server.process.pid), num_threads(server.process.pid)
        outcomes = first + second
        bad = unexpected(outcomes)
        leaks = kv_leaks(info)
        open_sessions = metric(server.metrics_port, "llmserve_sessions")
        extra = [
            f"unexpected statuses: {bad or 'none'}",
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


if __name__ == "__main__":
    main()
