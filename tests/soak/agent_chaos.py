"""Agent chaos: a seeded mix of what agents do to the Responses and Messages routes, on loopback.

    python -m tests.soak.agent_chaos --calls 600 [--seed 5] [--out docs/reliability.md]

starts its own server (4 slots, --max-queue 4, --session-dir, HTTP) and sends from 6
threads: stored responses, continuations of them by `previous_response_id` (chains),
streams the client drops after the first delta, background responses polled or cancelled,
deletes, Anthropic Messages whole, streamed and dropped, tight deadlines, and bodies that
must be refused. Each call must end with a status its kind allows. Then: the server is
alive with every slot idle, llama.cpp's KV holding exactly the slots' cached prefixes and
no open session; every stored response the server acknowledged (200, or a background one
that ended) and the client did not delete is answered by `GET /v1/responses/{id}`; the
server is restarted on the same directory and answers each of them again, and a
continuation of one starts from its saved KV (cached tokens at least its input).
"""

from __future__ import annotations

import argparse
import json
import random
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from harness.server import RunningServer, free_port, start_server, stop_server
from tests.soak.server_state import kv_leaks, wait_until_idle

SERVER_ARGS = ["-np", "4", "-c", "4096", "-t", "2", "--max-queue", "4"]
MODEL = "gemma-3-270m-q4_k_m"
TIMEOUT_S = 120.0
BUSY = {429, 503}  # a full server refuses with a retry hint: any kind may meet it
# kind -> the statuses it may end with (besides BUSY); "dropped": the client closed the stream
ALLOWED: dict[str, set[int | str]] = {
    "respond": {200}, "continue": {200, 400}, "stream_drop": {200, "dropped"}, "background": {200},
    "delete": {200, 404}, "messages": {200}, "messages_stream": {200}, "messages_drop": {200, "dropped"},
    "deadline": {200, 408}, "bad": {400},
}
BAD_BODIES = ({"input": []}, {"input": "x", "max_output_tokens": 0}, {"input": "x", "temperature": "hot"},
              {"input": "x", "previous_response_id": "resp_never"}, {"input": "x", "include": ["nope"]},
              {"input": [{"type": "message", "role": "robot", "content": "x"}]}, {"input": "x", "text": 3})


@dataclass
class AgentRun:
    statuses: Counter[tuple[str, int | str]] = field(default_factory=Counter)
    acknowledged: dict[str, int] = field(default_factory=dict)  # stored response id -> its input tokens
    deleted: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def ids(self) -> list[str]:
        with self.lock:
            return [key for key in self.acknowledged if key not in self.deleted]

    def unexpected(self) -> dict[tuple[str, int | str], int]:
        return {k: n for k, n in self.statuses.items() if k[1] not in ALLOWED[k[0]] | BUSY}


def _respond(client: httpx.Client, run: AgentRun, body: dict[str, Any]) -> int:
    reply = client.post("/v1/responses", json={"model": MODEL, "max_output_tokens": 6, **body})
    if reply.status_code == 200 and reply.json().get("store", True):
        with run.lock:
            run.acknowledged[reply.json()["id"]] = reply.json()["usage"]["input_tokens"]
    return reply.status_code


def _dropped(client: httpx.Client, path: str, body: dict[str, Any]) -> int | str:
    with client.stream("POST", path, json={"model": MODEL, "stream": True, **body}) as reply:
        if reply.status_code != 200:
            return reply.status_code
        for line in reply.iter_lines():
            if '"text_delta"' in line or '"response.output_text.delta"' in line:
                return "dropped"  # leaving the block closes the connection mid-turn
    return 200


def _background(client: httpx.Client, run: AgentRun, rng: random.Random) -> int:
    queued = client.post("/v1/responses", json={"model": MODEL, "input": "Tell a story.", "background": True,
                                                 "max_output_tokens": rng.choice([4, 24])})
    if queued.status_code != 200:
        return queued.status_code
    key = queued.json()["id"]
    if rng.random() < 0.4:
        client.post(f"/v1/responses/{key}/cancel")
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        got = client.get(f"/v1/responses/{key}")
        if got.status_code != 200 or got.json()["status"] not in ("queued", "in_progress"):
            if got.status_code == 200 and got.json()["status"] in ("completed", "incomplete", "cancelled"):
                with run.lock:
                    run.acknowledged[key] = 0  # kept; its input is short
            return got.status_code
        time.sleep(0.1)
    return 599  # never ended: not an allowed status


def one_call(client: httpx.Client, run: AgentRun, rng: random.Random) -> tuple[str, int | str]:
    kind = rng.choice(list(ALLOWED))
    ids = run.ids()
    prompt = rng.choice(["Name a colour.", "Say hi.", "Count to three.", "What is 2+2?"])
    if kind in ("continue", "delete") and not ids:
        kind = "respond"
    if kind == "respond":
        return kind, _respond(client, run, {"input": prompt, "store": rng.random() < 0.9})
    if kind == "continue":
        return kind, _respond(client, run, {"input": prompt, "previous_response_id": rng.choice(ids)})
    if kind == "stream_drop":
        return kind, _dropped(client, "/v1/responses", {"input": "Tell a long story.", "max_output_tokens": 64})
    if kind == "background":
        return kind, _background(client, run, rng)
    if kind == "delete":
        key = rng.choice(ids)
        with run.lock:
            run.deleted.add(key)  # before the call: a continuation racing it may find it gone
        return kind, client.delete(f"/v1/responses/{key}").status_code
    messages = {"max_tokens": 6, "messages": [{"role": "user", "content": prompt}]}
    if kind == "messages":
        return kind, client.post("/v1/messages", json={"model": MODEL, **messages}).status_code
    if kind == "messages_stream":
        with client.stream("POST", "/v1/messages", json={"model": MODEL, "stream": True, **messages}) as reply:
            reply.read()
            return kind, reply.status_code
    if kind == "messages_drop":
        return kind, _dropped(client, "/v1/messages", {**messages, "max_tokens": 64})
    if kind == "deadline":
        reply = client.post("/v1/responses", json={"model": MODEL, "input": prompt, "max_output_tokens": 32},
                            headers={"x-request-timeout": str(rng.choice([0.05, 0.3]))})
        return kind, reply.status_code
    return kind, client.post("/v1/responses", content=json.dumps(rng.choice(BAD_BODIES))).status_code


def run_agent_chaos(http_url: str, calls: int, seed: int, workers: int = 6) -> AgentRun:
    run = AgentRun()

    def worker(index: int) -> None:
        rng = random.Random(f"{seed}-{index}")
        with httpx.Client(base_url=http_url, timeout=TIMEOUT_S) as client:
            for _ in range(calls // workers):
                try:
                    outcome = one_call(client, run, rng)
                except httpx.HTTPError as exc:
                    outcome = ("client", type(exc).__name__)
                with run.lock:
                    run.statuses[outcome] += 1

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(worker, range(workers)))
    return run


def missing(http_url: str, run: AgentRun) -> list[str]:
    """The acknowledged, undeleted stored responses the server does not answer."""
    with httpx.Client(base_url=http_url, timeout=30) as client:
        return [key for key in run.ids() if client.get(f"/v1/responses/{key}").status_code != 200]


def server_findings(server: RunningServer, run: AgentRun) -> list[str]:
    """After the calls: idle, clean KV, no open session, no internal error, nothing stored lost."""
    info = wait_until_idle(server.address)
    log = Path(server.log_path).read_text()
    findings = kv_leaks(info) + [f"stored response {key} lost" for key in missing(_url(server), run)]
    findings += [f"log: {word}" for word in ("http_internal_error", "executor_step_failed") if word in log]
    return findings + ([] if server.process.poll() is None else ["the server exited"])


def after_restart(server: RunningServer, run: AgentRun) -> list[str]:
    """The restarted server answers every acknowledged response, and continues one from its KV."""
    findings = [f"stored response {key} lost at the restart" for key in missing(_url(server), run)]
    chained = [key for key in run.ids() if run.acknowledged[key] > 0]
    if chained:
        key = chained[-1]
        with httpx.Client(base_url=_url(server), timeout=TIMEOUT_S) as client:
            reply = client.post("/v1/responses", json={"model": MODEL, "previous_response_id": key, "input": "And?",
                                                       "max_output_tokens": 2})
        if reply.status_code != 200:
            return [*findings, f"the continuation of {key} after the restart: {reply.status_code} {reply.text[:200]}"]
        cached = reply.json()["usage"]["input_tokens_details"]["cached_tokens"]
        if cached < run.acknowledged[key]:
            findings.append(f"the continuation of {key} after the restart cached {cached} of {run.acknowledged[key]}")
    return findings


def _url(server: RunningServer) -> str:
    return f"http://127.0.0.1:{server.http_port}"


def chaos_and_restart(directory: Path, calls: int, seed: int) -> tuple[AgentRun, list[str]]:
    """The whole run: a server, the calls, its checks, a restart and the checks after it."""
    args = [*SERVER_ARGS, "--session-dir", str(directory / "sessions"), "--store-kv"]
    server = start_server(args, directory / "server-1.log", http_port=free_port())
    try:
        run = run_agent_chaos(_url(server), calls, seed)
        findings = server_findings(server, run)
    finally:
        if stop_server(server) != 0:
            findings = [*locals().get("findings", []), "the server did not stop cleanly"]
    server = start_server(args, directory / "server-2.log", http_port=free_port())
    try:
        findings += after_restart(server, run)
    finally:
        stop_server(server)
    return run, findings


def report(run: AgentRun, calls: int, seed: int, findings: list[str]) -> str:
    kinds = sorted({kind for kind, _ in run.statuses})
    codes = sorted({str(code) for _, code in run.statuses})
    rows = [f"| {kind} | " + " | ".join(str(run.statuses.get((kind, int(c) if c.isdigit() else c), "")) for c in codes)
            + " |" for kind in kinds]
    return "\n".join([f"{calls} calls, seed {seed} (`python -m tests.soak.agent_chaos --calls {calls} --seed {seed}`)",
                      "", "| kind | " + " | ".join(codes) + " |", "|---|" + "---|" * len(codes), *rows, "",
                      f"* stored responses acknowledged: {len(run.acknowledged)}, deleted by the client: "
                      f"{len(run.deleted)}", f"* unexpected statuses: {run.unexpected() or 'none'}",
                      f"* the server's side and after the restart: {findings or 'clean'}", ""])


def main() -> None:
    import tempfile

    from tests.soak.combos import write_section

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=600)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        run, findings = chaos_and_restart(Path(scratch), args.calls, args.seed)
    text = report(run, args.calls, args.seed, findings)
    print(text)
    if args.out is not None:
        write_section(args.out, "Agent chaos: Responses and Messages (tests/soak/agent_chaos.py)", text)
    raise SystemExit(1 if findings or run.unexpected() else 0)


if __name__ == "__main__":
    main()
