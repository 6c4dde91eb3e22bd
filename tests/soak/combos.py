"""Combination fuzzer: valid features together, plus adversarial values, against a real server.

    python -m tests.soak.combos --calls 600 [--seed 5] [--server-args "-kvu"] [--only 17] [--surface mixed]

Every feature worked alone; combinations crashed the process (a grammar with
ignore_eos), hung it (a schema with a huge repetition count) or lost data. This
drives a real server from several threads with seeded plans (tests/soak/plans.py):
each call draws a constraint (none, GBNF, JSON schema) x ignore_eos x min_tokens x
logit_bias x n x stop strings/ids x logprobs x chat or text x session_id x 1-3 turns
x how it ends (half-close, in-band cancel, call cancel, short deadline, disconnect, a
turn queued early, one end_of_turn too many); one call in five also carries one
adversarial value. Each call is recorded whole and checked by an oracle that predicts
its outcome (tests/soak/oracle.py, oracle_run.py): status, every turn and sample,
limits, stops, logprobs, grammar and schema validity, the ids against the text,
cached prefixes across turns and streams. Afterwards the process lives, every slot is
idle with llama.cpp's KV holding exactly the cached prefixes, no session is open, RSS
stays under a bound and the log has no error. A finding prints its plan and how to
send that call again. `make test` runs 150 calls (test_combos.py) and 36 over HTTP,
`make soak` 600 in each server configuration and 600 mixed. `--models` serves a further model
beside the default and draws each plan's model (named sessions keep to theirs).

`--surface http` sends the plans over the OpenAI HTTP API instead (tests/soak/http_call.py):
the same drawing, restricted to what one OpenAI request expresses, translated back
(http_translate.py) and judged by the same oracle; `--surface mixed` draws each plan's
surface, and both kinds run side by side against one server.
"""

from __future__ import annotations

import argparse
import queue
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
from llmserve.client import pb
from llmserve.client.errors import from_rpc_error
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc

from harness.metrics import total
from harness.models import OTHER_MODEL, two_model_flags
from harness.server import rss_kb
from tests.soak.http_call import eog_pieces, run_http_plan
from tests.soak.oracle import CallRecord, RunContext, Status, sample_turns
from tests.soak.oracle_run import Verdict, check_run, log_problems, preempted_requests
from tests.soak.plans import SURFACES, Plan, draw_plans
from tests.soak.server_state import kv_leaks, wait_until_idle

ROOT = Path(__file__).resolve().parents[2]
NUM_SLOTS, MAX_QUEUE = 4, 4
SERVER_ARGS = [
    "-np", str(NUM_SLOTS), "-c", "4096", "-t", "2", "--max-queue", str(MAX_QUEUE), "--first-message-timeout", "3",
]
WORKERS = NUM_SLOTS + MAX_QUEUE  # sized to fill the queue: RESOURCE_EXHAUSTED may happen, rarely
# Only a guard against hangs: 3 turns behind a full queue took over 120 s on a 2-core machine
# shared with other servers (queue 63 s, 0.4 tokens/s per stream).
CALL_TIMEOUT = 300.0
MAX_RSS_MIB = 2048


class _Requests:
    def __init__(self) -> None:
        self.queue: queue.Queue[pb.GenerateRequest | None] = queue.Queue()

    def put(self, item: pb.GenerateRequest | None) -> None:
        self.queue.put(item)

    def __iter__(self) -> Iterator[pb.GenerateRequest]:
        while (item := self.queue.get()) is not None:
            yield item


def run_plan(address: str, plan: Plan, tools: pb_grpc.LLMServiceStub) -> CallRecord:
    """Send one plan and record everything that came back (the oracle judges it later)."""
    channel = grpc.insecure_channel(address)
    requests = _Requests()
    rec = CallRecord(plan, [], Status("OK"), t_start=time.monotonic())
    ending = plan.ending
    try:
        requests.put(pb.GenerateRequest(config=plan.config, input=plan.input(0), end_of_turn=True))
        call = pb_grpc.LLMServiceStub(channel).Generate(iter(requests), timeout=plan.deadline_s or CALL_TIMEOUT)
        sent = 1
        if ending == "early_turn" and plan.turns > 1:  # the next turn before this reply ends
            requests.put(pb.GenerateRequest(input=plan.input(1), end_of_turn=True))
            sent = 2
        if ending == "extra_end_of_turn":
            for _ in range(3):
                requests.put(pb.GenerateRequest(end_of_turn=True))
        ends, turns_done = 0, 0
        for response in call:
            rec.responses.append(response)
            if response.HasField("chunk") and not rec.acted and ending in ("cancel_call", "disconnect", "cancel_in_band"):
                if ending == "cancel_call":
                    call.cancel()
                elif ending == "disconnect":
                    channel.close()
                else:
                    requests.put(pb.GenerateRequest(cancel=True))
                rec.acted = True
            if not response.HasField("turn_end"):
                continue
            ends += 1
            if ends % plan.num_samples == 0:
                turns_done += 1
                if sent < plan.turns:
                    requests.put(pb.GenerateRequest(input=plan.input(sent), end_of_turn=True))
                    sent += 1
                else:
                    requests.put(None)
    except grpc.RpcError as err:
        e = from_rpc_error(err)
        rec.status = Status(e.code().name, e.details(), tuple(f for f, _ in e.field_violations), e.retry_after_s)
    except ValueError as err:  # the channel was closed under the call (disconnect)
        rec.status = Status("CANCELLED" if ending == "disconnect" and rec.acted else "CLIENT-ERROR", str(err))
    finally:
        requests.put(None)
        channel.close()
        rec.t_end = time.monotonic()
    _detokenize(rec, tools)
    return rec


def _detokenize(rec: CallRecord, tools: pb_grpc.LLMServiceStub) -> None:
    special = rec.plan.config.output.include_special
    turns, _ = sample_turns(rec.responses, rec.plan.num_samples)
    for key, st in turns.items():
        if st.ids:
            texts = [tools.Detokenize(pb.DetokenizeRequest(ids=ids, render_special=special, model=rec.plan.config.model),
                                      timeout=30).text
                     for ids in (st.ids, st.ids[:-1])]
            rec.decoded[key] = (texts[0], texts[1])


def run_combos(address: str, plans: list[Plan], workers: int = WORKERS, http_url: str = "") -> list[CallRecord]:
    """Every plan, on its surface (`http_url`: the OpenAI API's base), from one pool of workers."""
    with grpc.insecure_channel(address) as channel, ThreadPoolExecutor(workers) as pool:
        tools = pb_grpc.LLMServiceStub(channel)
        return list(pool.map(lambda plan: run_http_plan(http_url, plan) if plan.surface == "http"
                             else run_plan(address, plan, tools), plans))


def run_context(info: pb.ModelInfo, workers: int, log_path: Path, address: str = "") -> RunContext:
    """`address`: ask the server for the end tokens' texts (HTTP plans' logprobs show them)."""
    log = log_path.read_text()
    return RunContext(frozenset(info.eog_token_ids), info.n_ctx_per_slot,
                      fills_queue=workers >= info.n_parallel + info.max_queue,
                      preempted=preempted_requests(log), closed_preempted=preempted_requests(log, at_close=True),
                      eog_pieces=eog_pieces(address, list(info.eog_token_ids)) if address else frozenset())


def server_findings(server, info: pb.ModelInfo, *further: pb.ModelInfo) -> list[str]:  # type: ignore[no-untyped-def]
    """After the run: alive, KV clean (the default model's and each `further` one's), no session
    open on any model, RSS bounded, nothing wrong in the log."""
    findings = [f"KV of {Path(each.path).name}: {leak}" for each in (info, *further) for leak in kv_leaks(each)]
    if server.process.poll() is not None:
        findings.append(f"the server exited with {server.process.returncode}")
    if server.metrics_port is not None and (open_sessions := total(server.metrics_port, "llmserve_sessions")):
        findings.append(f"{open_sessions:.0f} sessions open after the run")
    if (rss := rss_kb(server.process.pid)) > MAX_RSS_MIB * 1024:
        findings.append(f"server RSS {rss / 1024:.0f} MiB (bound {MAX_RSS_MIB})")
    return findings + [f"log: {line}" for line in log_problems(Path(server.log_path).read_text())]


def rerun_hint(seed: int, calls: int, index: int | None, server_args: str = "", surface: str = "grpc",
               models: bool = False) -> str:
    args = f" --server-args={server_args!r}" if server_args else ""
    args += f" --surface {surface}" if surface != "grpc" else ""
    args += " --models" if models else ""
    only = f" --only {index}" if index is not None else ""
    return f"python -m tests.soak.combos --calls {calls} --seed {seed}{args}{only}"


def failure_text(verdict: Verdict, plans: list[Plan], seed: int, server_args: str = "", limit: int = 20,
                 surface: str = "grpc", models: bool = False) -> str:
    """Each finding with its plan, and the command that sends that call again."""
    lines = []
    for f in verdict.findings[:limit]:
        if f.index is None:
            lines.append(f"run (seed {seed}): {f.text}")
        else:
            rid = f" (request id {f.request_id})" if f.request_id else ""
            lines.append(f"{f.text}{rid}\n    {plans[f.index].describe()}\n    rerun: "
                         f"{rerun_hint(seed, len(plans), f.index, server_args, surface, models)}")
    more = len(verdict.findings) - limit
    return "\n".join(lines) + (f"\n... and {more} more findings" if more > 0 else "")


def report(verdict: Verdict, calls: int, seed: int, workers: int, extra: list[str], server_args: str = "",
           surface: str = "grpc", models: bool = False) -> str:
    statuses = sorted({s for _, s in verdict.statuses})
    labels = sorted({label for label, _ in verdict.statuses})
    lines = ["| plan | " + " | ".join(statuses) + " | calls with findings |", "|---|" + "---|" * (len(statuses) + 1)]
    for label in labels:
        cells = [str(verdict.statuses.get((label, s), "")) for s in statuses]
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {verdict.failed.get(label, 0)} |")
    refused = 100 * verdict.num_refused / max(verdict.num_valid, 1)
    summary = [
        f"workers {workers} ({'sized to fill' if workers >= NUM_SLOTS + MAX_QUEUE else 'below'} the "
        f"{NUM_SLOTS} slots + {MAX_QUEUE} queue)",
        f"valid calls refused RESOURCE_EXHAUSTED: {verdict.num_refused} of {verdict.num_valid} ({refused:.1f}%, bound 5%)",
        f"named-session continuations checked: {verdict.sessions_checked} "
        f"(order unknown, not checked: {verdict.sessions_unknown}; text sessions saved without KV after a "
        f"preemption, not checked: {verdict.sessions_recomputed})",
        f"in-band cancels that ended a turn CANCELLED: {verdict.cancels_effective} of {verdict.cancels_sent}",
        f"calls whose stream the server preempted (cached_tokens over turns not checked): {verdict.num_preempted}",
        f"oracle findings: {len(verdict.findings)}",
    ]
    return (f"{calls} calls, seed {seed} (`{rerun_hint(seed, calls, None, server_args, surface, models)}`)\n\n" + "\n".join(lines)
            + "\n\n" + "\n".join(f"* {e}" for e in summary + extra) + "\n")


def write_section(out: Path, name: str, text: str) -> None:
    """Replace the `<!-- combos NAME -->` block of `out` (appended when missing)."""
    begin, end = f"<!-- combos {name} -->", f"<!-- /combos {name} -->"
    old = out.read_text() if out.exists() else ""
    block = f"{begin}\n{text}{end}"
    if begin in old and end in old:
        new = old.split(begin)[0] + block + old.split(end, 1)[1]
    else:
        new = old.rstrip("\n") + "\n\n" + block + "\n"
    out.write_text(new)


def main() -> int:
    from harness.server import free_port, start_server, stop_server

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=600)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--workers", type=int, default=WORKERS)
    parser.add_argument("--only", type=int, default=None, help="send only this plan (its index in the seed's plans)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--server-args", default="", help="extra serve flags, e.g. '--spec-type ngram-simple'")
    parser.add_argument("--surface", choices=SURFACES, default="grpc",
                        help="gRPC, the OpenAI HTTP API, or each plan's drawn (multi-turn and named sessions: gRPC)")
    parser.add_argument("--models", action="store_true",
                        help=f"serve a further model ({OTHER_MODEL}, harness/models.py) and draw each plan's model")
    args = parser.parse_args()
    models = ("", OTHER_MODEL) if args.models else ()
    all_plans = draw_plans(args.calls, args.seed, args.surface, models)
    plans = all_plans if args.only is None else [all_plans[args.only]]
    session_dir = Path(tempfile.mkdtemp(prefix="llmserve-combos-"))  # fresh: no sessions of earlier runs
    model_flags = two_model_flags() if args.models else []
    server = start_server([*SERVER_ARGS, *model_flags, "--session-dir", str(session_dir), *args.server_args.split()],
                          Path("/tmp/llmserve-combos.log"), metrics=True,
                          http_port=free_port() if args.surface != "grpc" else None)
    http_url = f"http://127.0.0.1:{server.http_port}" if server.http_port else ""
    started = time.monotonic()
    try:
        records = run_combos(server.address, plans, args.workers, http_url)
        info = wait_until_idle(server.address)
        further = [wait_until_idle(server.address, model=name) for name in models if name]
        verdict = check_run(records, run_context(info, args.workers, Path(server.log_path), server.address))
        problems = server_findings(server, info, *further)
        extra = [f"extra server flags: {args.server_args or 'none'}", f"run time {time.monotonic() - started:.0f} s",
                 f"surface {args.surface}: {sum(p.surface == 'http' for p in plans)} calls over HTTP, "
                 f"{sum(p.surface == 'grpc' for p in plans)} over gRPC",
                 f"server RSS after the run: {rss_kb(server.process.pid) / 1024:.0f} MiB (bound {MAX_RSS_MIB})",
                 f"server checks after the run (alive, KV, open sessions, RSS, log): {problems or 'clean'}"]
    finally:
        code = stop_server(server)
        shutil.rmtree(session_dir, ignore_errors=True)
    extra.append(f"server exit code after SIGTERM: {code}")
    extra += [f"finding, plan {f.index}: {f.text}" for f in verdict.findings[:10]]
    text = report(verdict, args.calls, args.seed, args.workers, extra, args.server_args, args.surface, args.models)
    print(text)
    if verdict.findings:
        print(failure_text(verdict, all_plans, args.seed, args.server_args, surface=args.surface, models=args.models),
              file=sys.stderr)
    if args.out and args.only is None:
        name = args.server_args or "default flags"
        name = name if args.surface == "grpc" else f"{name}, surface {args.surface}"
        write_section(args.out, f"{name}, two models" if args.models else name, text)
    return 1 if verdict.findings or problems or code != 0 else 0


if __name__ == "__main__":
    sys.exit(main())
