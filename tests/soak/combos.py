"""Combination fuzzer: valid features together, plus adversarial values, against a real server.

    python -m tests.soak.combos --calls 600 [--seed 5]

Every feature worked alone; combinations crashed the process (a grammar with
ignore_eos), hung it (a schema with a huge repetition count) or lost data. This
drives a real server from 6 threads with a seeded generator: each call draws a
constraint (none, GBNF, JSON schema) x ignore_eos x min_tokens x logit_bias x n x
stop strings/ids x logprobs x chat or text x session_id x 1-3 turns x how it ends
(half-close, in-band cancel, call cancel, short deadline, disconnect, a turn queued
early, one end_of_turn too many). One call in five also carries one adversarial
value. Each call's status must be one its plan allows (every call has a deadline,
so nothing can hang); afterwards the process lives, every slot is idle with
llama.cpp's KV holding exactly the cached prefixes, no session is open, and RSS
stays under a bound. `make test` runs a short run (test_combos.py), `make soak` a long one.
"""

from __future__ import annotations

import argparse
import json
import queue
import random
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from llmserve.client import make_input, pb
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc

ROOT = Path(__file__).resolve().parents[2]
SERVER_ARGS = [
    "-np", "4", "-c", "4096", "-t", "2", "--max-queue", "4", "--first-message-timeout", "3",
    "--chat-template-file", str(ROOT / "templates" / "gemma3.jinja"),
]
CALL_TIMEOUT = 60.0
MAX_RSS_MIB = 2048
EOG_IDS = (1, 106, 212)
GRAMMARS = ['root ::= "yes"', 'root ::= "yes" | "no"', "root ::= [a-z]+", 'root ::= "{" [a-z ]* "}"']
SCHEMAS = [
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}, "required": ["a"]},
    {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 3},
    {"type": "string", "pattern": "^[a-c]{2,5}$"},
]
ADVERSARIAL = {
    "seed_default": lambda c: setattr(c.sampling, "seed", 0xFFFFFFFF),
    "schema_pattern_1e6": lambda c: setattr(c.constraint, "json_schema", json.dumps(
        {"type": "string", "pattern": "^a{1,1000000}$"})),
    "schema_min_items_1e8": lambda c: setattr(c.constraint, "json_schema", json.dumps(
        {"type": "array", "items": {"type": "integer"}, "minItems": 100000000})),
    "grammar_left_recursive": lambda c: setattr(c.constraint, "grammar", 'root ::= root "a" | "a"'),
    "grammar_broken": lambda c: setattr(c.constraint, "grammar", "root ::= ((("),
    "max_tokens_huge": lambda c: setattr(c.stopping, "max_tokens", 10**7),
    "temperature_nan": lambda c: setattr(c.sampling, "temperature", float("nan")),
    "n_too_many": lambda c: setattr(c, "n", 99),
    "stop_id_outside": lambda c: c.stopping.stop_token_ids.append(262144),
    "bias_outside": lambda c: c.sampling.logit_bias.__setitem__(-3, 1.0),
}
PROMPTS = ["Answer yes or no: is water wet?", "List three colours:", "Write JSON:", "Say something short."]
OK = "OK"
FINISHES = set(pb.FinishReason.values()) - {pb.FINISH_REASON_UNSPECIFIED}


@dataclass
class Plan:
    config: pb.SessionConfig
    chat: bool
    turns: int
    ending: str
    adversarial: str = ""
    expected: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class Outcome:
    ending: str
    adversarial: str
    status: str
    expected: bool


def draw(rng: random.Random, session_ids: list[str]) -> Plan:
    c = pb.SessionConfig()
    c.sampling.temperature = rng.choice([0.0, 0.0, 0.7])
    c.sampling.seed = rng.randrange(1000)
    if rng.random() < 0.2:
        c.sampling.dry_multiplier = 0.8
    if rng.random() < 0.2:
        c.sampling.repeat_penalty = 1.1
    bias = rng.random()
    if bias < 0.2:
        for t in EOG_IDS:
            c.sampling.logit_bias[t] = float("-inf")
    elif bias < 0.3:
        c.sampling.logit_bias[rng.randrange(3, 5000)] = rng.choice([-5.0, 5.0, float("-inf")])
    kind = rng.random()
    if kind < 0.3:
        c.constraint.grammar = rng.choice(GRAMMARS)
    elif kind < 0.5:
        c.constraint.json_schema = json.dumps(rng.choice(SCHEMAS))
    c.stopping.max_tokens = rng.randint(1, 20)
    c.stopping.min_tokens = rng.choice([0, 0, rng.randint(0, c.stopping.max_tokens)])
    c.stopping.ignore_eos = rng.random() < 0.3
    if rng.random() < 0.2:
        c.stopping.stop.append(rng.choice(["\n", "yes", "a", ".", "}"]))
    if rng.random() < 0.15:
        c.stopping.stop_token_ids.append(rng.randrange(200, 3000))
    if rng.random() < 0.3:
        c.output.top_logprobs = rng.choice([0, 3])
    if rng.random() < 0.08:
        c.output.prompt_logprobs = True
    chat = rng.random() < 0.35
    if rng.random() < 0.3:  # a named session keeps to one input kind: ids per kind
        c.session_id = rng.choice(session_ids) + ("-chat" if chat else "-text")
    elif rng.random() < 0.25:
        c.n = rng.randint(2, 3)
    ending = rng.choice(["close", "close", "close", "cancel_in_band", "cancel_call", "deadline", "disconnect",
                         "early_turn", "extra_end_of_turn"])
    plan = Plan(c, chat=chat, turns=rng.randint(1, 3), ending=ending)
    plan.expected = {OK, "RESOURCE_EXHAUSTED"}
    if c.session_id:
        plan.expected.add("FAILED_PRECONDITION")  # another stream holds the id, or its save is on its way
    plan.expected |= {"cancel_call": {"CANCELLED"}, "disconnect": {"CANCELLED"}, "deadline": {"DEADLINE_EXCEEDED"},
                      "extra_end_of_turn": {"FAILED_PRECONDITION"}}.get(ending, set())
    if rng.random() < 0.2:
        plan.adversarial = rng.choice(sorted(ADVERSARIAL))
        ADVERSARIAL[plan.adversarial](c)
        plan.expected = {"INVALID_ARGUMENT", "RESOURCE_EXHAUSTED"} | ({"DEADLINE_EXCEEDED"} if ending == "deadline" else set())
    return plan


def _input(plan: Plan, rng: random.Random) -> pb.Input:
    text = rng.choice(PROMPTS)
    if not plan.chat:
        return make_input(text)
    return pb.Input(messages=pb.ChatMessages(messages=[pb.ChatMessage(role="user", content=text)]))


class _Requests:
    def __init__(self) -> None:
        self.queue: queue.Queue[pb.GenerateRequest | None] = queue.Queue()

    def __iter__(self) -> Iterator[pb.GenerateRequest]:
        while (item := self.queue.get()) is not None:
            yield item


def run_plan(address: str, plan: Plan, rng: random.Random) -> tuple[str, str]:
    """Run one call; returns the status the client saw and its details. Checks every turn end it reads."""
    channel = grpc.insecure_channel(address)
    requests = _Requests()
    timeout = rng.choice([0.05, 0.3, 1.0]) if plan.ending == "deadline" else CALL_TIMEOUT
    try:
        requests.queue.put(pb.GenerateRequest(config=plan.config, input=_input(plan, rng), end_of_turn=True))
        call = pb_grpc.LLMServiceStub(channel).Generate(iter(requests), timeout=timeout)
        turns_left = plan.turns
        if plan.ending == "early_turn" and turns_left > 1:  # the next turn before this reply ends
            requests.queue.put(pb.GenerateRequest(input=_input(plan, rng), end_of_turn=True))
            turns_left -= 1
        if plan.ending == "extra_end_of_turn":
            for _ in range(3):
                requests.queue.put(pb.GenerateRequest(end_of_turn=True))
        num_samples = max(plan.config.n, 1)
        ends = 0
        for response in call:
            if plan.ending in ("cancel_call", "disconnect") and response.HasField("chunk"):
                call.cancel() if plan.ending == "cancel_call" else channel.close()
            if plan.ending == "cancel_in_band" and response.HasField("chunk") and ends == 0:
                requests.queue.put(pb.GenerateRequest(cancel=True))
            if not response.HasField("turn_end"):
                continue
            assert response.turn_end.finish_reason in FINISHES, response.turn_end
            ends += 1
            if ends % num_samples == 0:
                turns_left -= 1
                if turns_left > 0:
                    requests.queue.put(pb.GenerateRequest(input=_input(plan, rng), end_of_turn=True))
                else:
                    requests.queue.put(None)
        return OK, ""
    except grpc.RpcError as err:
        return err.code().name, err.details() or ""  # type: ignore[no-any-return]
    except ValueError as err:  # the channel was closed under the call (disconnect)
        return ("CANCELLED", "") if plan.ending == "disconnect" else (f"CLIENT-ERROR {err}", "")
    finally:
        requests.queue.put(None)
        channel.close()


def run_combos(address: str, calls: int, seed: int, workers: int = 6,
               unexpected: list[str] | None = None) -> Counter[Outcome]:
    """`unexpected` collects a line per call whose status its plan does not allow."""
    rng = random.Random(seed)
    ids = [f"combo-{seed}-{i}" for i in range(3)]
    plans = [(draw(rng, ids), random.Random(rng.random())) for _ in range(calls)]

    def one(item: tuple[Plan, random.Random]) -> Outcome:
        plan, call_rng = item
        status, details = run_plan(address, plan, call_rng)
        ok = status in plan.expected or (plan.ending in ("cancel_call", "disconnect", "deadline") and status == OK)
        if not ok and unexpected is not None:
            c = plan.config
            unexpected.append(f"{status} {details!r}: ends by {plan.ending}, chat={plan.chat}, turns={plan.turns}, "
                              f"session_id={c.session_id!r}, n={c.n}, adversarial={plan.adversarial!r}")
        return Outcome(plan.ending, plan.adversarial, status, ok)

    with ThreadPoolExecutor(workers) as pool:
        return Counter(pool.map(one, plans))


def report(outcomes: Counter[Outcome], calls: int, seed: int, extra: list[str]) -> str:
    by_status: Counter[str] = Counter()
    rows: Counter[tuple[str, str]] = Counter()
    for o, n in outcomes.items():
        by_status[o.status] += n
        rows[(o.adversarial or f"valid, ends by {o.ending}", o.status)] += n
    statuses = sorted(by_status)
    lines = ["| plan | " + " | ".join(statuses) + " |", "|---|" + "---|" * len(statuses)]
    for plan in sorted({p for p, _ in rows}):
        lines.append(f"| {plan} | " + " | ".join(str(rows.get((plan, s), "")) for s in statuses) + " |")
    bad = sum(n for o, n in outcomes.items() if not o.expected)
    return (f"{calls} calls, seed {seed} (`python -m tests.soak.combos --calls {calls} --seed {seed}`), "
            f"unexpected statuses: {bad}\n\n" + "\n".join(lines) + "\n\n" + "\n".join(f"* {e}" for e in extra) + "\n")


def main() -> None:
    from tests.conftest import start_server, stop_server
    from tests.soak import chaos

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=600)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--server-args", default="", help="extra serve flags, e.g. '--spec-type ngram-simple'")
    args = parser.parse_args()
    session_dir = Path(tempfile.mkdtemp(prefix="llmserve-combos-"))  # fresh: no sessions of earlier runs
    server = start_server([*SERVER_ARGS, "--session-dir", str(session_dir), *args.server_args.split()],
                          Path("/tmp/llmserve-combos.log"))
    started = time.monotonic()
    unexpected: list[str] = []
    try:
        outcomes = run_combos(server.address, args.calls, args.seed, unexpected=unexpected)
        info = chaos.wait_until_idle(server.address)
        extra = [
            f"extra server flags: {args.server_args or 'none'}",
            f"run time {time.monotonic() - started:.0f} s",
            f"KV check after the run: {chaos.kv_leaks(info) or 'clean'}",
            f"server RSS after the run: {chaos.rss_kb(server.process.pid) / 1024:.0f} MiB (bound {MAX_RSS_MIB})",
            f"server alive: {server.process.poll() is None}",
        ]
    finally:
        code = stop_server(server)
        shutil.rmtree(session_dir, ignore_errors=True)
    extra.append(f"server exit code after SIGTERM: {code}")
    extra += [f"unexpected: {line}" for line in sorted(unexpected)[:10]]
    text = report(outcomes, args.calls, args.seed, extra)
    print(text)
    if args.out:
        body = args.out.read_text().split("<!-- combos -->")[0] if args.out.exists() else ""
        rest = args.out.read_text().split("<!-- /combos -->")[1] if "<!-- /combos -->" in args.out.read_text() else ""
        args.out.write_text(body + "<!-- combos -->\n" + text + "<!-- /combos -->" + rest)


if __name__ == "__main__":
    main()
