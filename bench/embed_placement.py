"""Where an embedding model runs: Embed texts/s of all-MiniLM-L6-v2 served two ways, in
alternating rounds (docs/adapters.md, "Embedding models are models too"):

    python -m bench.embed_placement [--rounds 3]

* flag:  `--embedding-model PATH`: on the default model's executor, embedding steps taking
  turns with generation steps;
* model: `-m minilm=PATH`: a further model with an executor thread of its own;

each with generation idle, and with 4 greedy streams of the default model decoding meanwhile
(the generation tokens/s during the Embed call are printed too).
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from pathlib import Path

from llmserve.client import Client
from llmserve.service.model.default_model import default_model_path

from harness.server import RunningServer, start_server, stop_server
from tools.embedding_model import convert

TEXTS = [f"Sentence number {i} about the weather, the sea and a small boat." for i in range(512)]
FLAGS = ["-np", "4", "-c", "4096", "-t", "2"]
NUM_STREAMS = 4


def embed_rate(address: str, model: str) -> float:
    with Client(address, timeout=300) as client:
        started = time.perf_counter()
        return len(list(client.embed(TEXTS, model=model))) / (time.perf_counter() - started)


def generate_until(address: str, stop: threading.Event, done: list[int]) -> None:
    with Client(address, timeout=300) as client:
        while not stop.is_set():
            reply = client.generate("Tell me a long story about a lighthouse keeper", max_tokens=32, temperature=0,
                                    ignore_eos=True)
            done.append(reply.turn_end.usage.completion_tokens)


def busy_rates(server: RunningServer, model: str) -> tuple[float, float]:
    """Embed texts/s while NUM_STREAMS streams generate, and their tokens/s meanwhile."""
    stop, done = threading.Event(), []
    threads = [threading.Thread(target=generate_until, args=(server.address, stop, done)) for _ in range(NUM_STREAMS)]
    for thread in threads:
        thread.start()
    time.sleep(1.0)
    before, started = sum(done), time.perf_counter()
    rate = embed_rate(server.address, model)
    elapsed, after = time.perf_counter() - started, sum(done)
    stop.set()
    for thread in threads:
        thread.join()
    return rate, (after - before) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    rounds = parser.parse_args().rounds
    minilm = convert()
    servers = {"flag": start_server([*FLAGS, "--embedding-model", str(minilm)], Path("/tmp/embed-placement-flag.log")),
               "model": start_server([*FLAGS, "-m", str(default_model_path()), "-m", f"minilm={minilm}"],
                                     Path("/tmp/embed-placement-model.log"))}
    results: dict[tuple[str, str], list[float]] = {}
    try:
        for rnd in range(rounds):
            for name in ("flag", "model") if rnd % 2 == 0 else ("model", "flag"):
                model = "minilm" if name == "model" else ""
                results.setdefault((name, "idle texts/s"), []).append(embed_rate(servers[name].address, model))
                rate, generated = busy_rates(servers[name], model)
                results.setdefault((name, "busy texts/s"), []).append(rate)
                results.setdefault((name, "generation tokens/s meanwhile"), []).append(generated)
                print(f"round {rnd} {name}: {[(k[1], round(v[-1], 1)) for k, v in results.items() if k[0] == name]}",
                      flush=True)
    finally:
        for server in servers.values():
            stop_server(server)
    for (name, what), values in results.items():
        print(f"{name:5} {what:30} median {statistics.median(values):.1f} ({', '.join(f'{v:.1f}' for v in values)})")


if __name__ == "__main__":
    main()
