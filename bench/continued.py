"""A continued response side by side with llama-server: TTFT of the second turn of a
~900-token conversation (issue 42's target).

    python -m bench.continued [--llama-server PATH] [--rounds 5] [--modes hot,cold]

llmserve continues the first turn by `previous_response_id` (stored, `--session-dir --store-kv`);
llama-server (the same llama.cpp tree, `--jinja` and the same Gemma 3 template file) gets
the whole conversation re-sent. Both `-np 4 -c 8192 -t 2`. Each round a new ~620-word
passage: the first turn whole (16 tokens), then the continuation streamed over raw SSE
(the same client code for both: the `openai` SDK's stream helper cannot read
llama-server's Responses events), TTFT to the first `response.output_text.delta`.
`hot`: the continuation right after its own first turn. `cold`: every round's first
turn, then both servers restarted (llmserve on the same `--session-dir`), then each
continuation. Servers measured one after the other, never at once.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from llmserve.client.workloads import CORPUS
from llmserve.service.engine.chat.chat import PACKAGED_TEMPLATES
from llmserve.service.model.default_model import default_model_path

from harness.server import RunningServer, free_port, start_server, stop_server

from .servers import DEFAULT_BUILD, start_llama_server, stop

MODEL = "gemma-3-270m-q4_k_m"
INSTRUCTIONS = "You are a careful reader."
QUESTION = "In one word: what is the passage about?"
FLAGS = ["-np", "4", "-c", "8192", "-t", "2"]


def passage(round_index: int) -> str:
    words = " ".join(CORPUS).split() * 10
    return f"Passage {round_index}: " + " ".join(words[round_index * 13:round_index * 13 + 620])


def post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    host, port = url.split("//")[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=300)
    conn.request("POST", "/v1/responses", json.dumps(body).encode(), {"Content-Type": "application/json"})
    answer = json.loads(conn.getresponse().read())
    conn.close()
    return answer


def streamed_ttft(url: str, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """(ms to the first text delta, the final usage) of a streamed `/v1/responses`."""
    host, port = url.split("//")[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=300)
    start = time.perf_counter()
    conn.request("POST", "/v1/responses", json.dumps({**body, "stream": True}).encode(),
                 {"Content-Type": "application/json"})
    first, usage = None, {}
    for raw in conn.getresponse():
        if not raw.startswith(b"data: "):
            continue
        event = json.loads(raw[6:])
        if event.get("type") == "response.output_text.delta" and first is None:
            first = time.perf_counter() - start
        if event.get("type") in ("response.completed", "response.incomplete"):
            usage = event["response"].get("usage") or {}
    conn.close()
    assert first is not None, "no text came"
    return 1000 * first, usage


def first_turn(url: str, text: str) -> dict[str, Any]:
    return post(url, {"model": MODEL, "instructions": INSTRUCTIONS, "input": text, "max_output_tokens": 16,
                      "temperature": 0})


def continuation(ours: bool, url: str, text: str, first: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    if ours:
        return streamed_ttft(url, {"model": MODEL, "instructions": INSTRUCTIONS, "previous_response_id": first["id"],
                                   "input": QUESTION, "max_output_tokens": 8, "temperature": 0})
    said = "".join(part["text"] for item in first["output"] if item["type"] == "message" for part in item["content"])
    conversation = [{"type": "message", "role": "user", "content": text},
                    {"type": "message", "role": "assistant", "content": said},
                    {"type": "message", "role": "user", "content": QUESTION}]
    return streamed_ttft(url, {"model": MODEL, "instructions": INSTRUCTIONS, "input": conversation,
                               "max_output_tokens": 8, "temperature": 0})


class Servers:
    """llmserve (on its --session-dir) and llama-server, each restartable."""

    def __init__(self, binary: Path, session_dir: Path, logs: Path) -> None:
        self.binary, self.session_dir, self.logs = binary, session_dir, logs
        self.num_starts = 0
        self.ours: RunningServer | None = None
        self.peer: Any = None
        self.start()

    def start(self) -> None:
        self.num_starts += 1
        self.ours = start_server([*FLAGS, "--session-dir", str(self.session_dir), "--store-kv"],
                                 self.logs / f"llmserve-{self.num_starts}.log", http_port=free_port())
        template = str(PACKAGED_TEMPLATES["gemma3"])
        self.peer, self.peer_url = start_llama_server(self.binary, default_model_path(),
                                                      self.logs / f"llama-server-{self.num_starts}.log", False,
                                                      ("-np", "4", "-c", "8192", "--jinja", "--chat-template-file",
                                                       template))

    def url(self, ours: bool) -> str:
        assert self.ours is not None
        return f"http://127.0.0.1:{self.ours.http_port}" if ours else self.peer_url

    def stop(self) -> None:
        if self.ours is not None:
            stop_server(self.ours)
        if self.peer is not None:
            stop(self.peer)


def run(binary: Path, rounds: int, mode: str) -> list[tuple[float, dict[str, Any], float, dict[str, Any]]]:
    """Per round: (llmserve ms, usage, llama-server ms, usage)."""
    with tempfile.TemporaryDirectory() as scratch:
        servers = Servers(binary, Path(scratch) / "sessions", Path(scratch))
        try:
            texts = [passage(r) for r in range(rounds)]
            firsts: list[dict[bool, dict[str, Any]]] = []
            rows = []
            for text in texts:
                firsts.append({ours: first_turn(servers.url(ours), text) for ours in (True, False)})
                if mode == "hot":
                    rows.append((*continuation(True, servers.url(True), text, firsts[-1][True]),
                                 *continuation(False, servers.url(False), text, firsts[-1][False])))
            if mode == "cold":
                servers.stop()
                servers.start()
                for text, first in zip(texts, firsts, strict=True):
                    rows.append((*continuation(True, servers.url(True), text, first[True]),
                                 *continuation(False, servers.url(False), text, first[False])))
            return rows
        finally:
            servers.stop()


def cached(usage: dict[str, Any]) -> str:
    return f"{usage.get('input_tokens')} / {(usage.get('input_tokens_details') or {}).get('cached_tokens')}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llama-server", type=Path, default=DEFAULT_BUILD / "llama-server")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--modes", default="hot,cold")
    args = parser.parse_args()
    for mode in args.modes.split(","):
        rows = run(args.llama_server, args.rounds, mode)
        print(f"\n{mode}: round | llmserve TTFT ms (prompt / cached) | llama-server TTFT ms (prompt / cached)")
        for i, (ours_ms, ours_usage, peer_ms, peer_usage) in enumerate(rows):
            print(f"| {i} | {ours_ms:.0f} ({cached(ours_usage)}) | {peer_ms:.0f} ({cached(peer_usage)}) |")
        ours_median = statistics.median(row[0] for row in rows)
        peer_median = statistics.median(row[2] for row in rows)
        print(f"| median | {ours_median:.0f} | {peer_median:.0f}: {ours_median / peer_median:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
