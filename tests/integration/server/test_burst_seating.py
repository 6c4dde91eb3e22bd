"""A burst of prompts takes sequence ids by length (issue 41 §3, `GenerationStep.seat_by_length`)
and, when it finishes, leaves the decode rows to the next step (`engine/executor/prompts_first.py`).

With one KV stream per slot llama.cpp splits a batch into ubatches of consecutive sequence
ids with equal tokens each: prompts whose lengths alternate over the ids make a ubatch for
each longer one's rest, in length order one for all of them, and a decode row beside them
one more. The real server and model: six prompts of 12 and 6 tokens, alternately, arrive
while a long prompt prefills, so they share one step (54 tokens) while its first decode row
waits: 2 ubatches (4 scattered; 3 with the decode row); each burst reply agrees with the
same prompt computed alone, from scratch (prompt logprobs reuse no prefix), within the
tolerance of tests/greedy.py: a slot traded with the wrong KV would not.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from llmserve.client import Client

from harness.metrics import counted, metric
from harness.server import serving
from tests.greedy import parting

FLAGS = ["-np", "8", "-c", "8192", "-t", "2", "--spec-type", "none"]
TEXTS = [f"{head}, and then the story went on for a long while without anyone noticing" for head in (
    "The old lighthouse keeper counted ships", "Seven green parrots argued about breakfast",
    "A quiet river winds through the valley", "Tomorrow the committee reviews the budget",
    "Bright copper kettles hum on the stove", "Every winter the northern lakes freeze")]
BUCKETS = ("1.0", "2.0", "+Inf")  # llmserve_step_ubatches
TOKEN_BUCKETS = ("8.0", "32.0", "64.0")  # llmserve_batch_tokens: decode steps hold 7, the burst 54


def _buckets(port: int | None) -> dict[str, float]:
    return {le: counted(port, "llmserve_step_ubatches_bucket", le=le) for le in BUCKETS} | {
        f"tokens {le}": counted(port, "llmserve_batch_tokens_bucket", kind="generate", le=le) for le in TOKEN_BUCKETS}


def _wait_running(port: int | None, n: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while metric(port, "llmserve_running_sessions") < n:
        assert time.monotonic() < deadline, "the long prompt never got a slot"
        time.sleep(0.002)


def test_a_burst_of_prompts_is_seated_by_length_in_one_step(tmp_path: Path) -> None:
    with serving(FLAGS, tmp_path / "server.log", metrics=True) as server, Client(server.address, timeout=120) as client:
        long_prompt = client.tokenize(" ".join(f"item{i} weighs {i * 7 % 13} kg." for i in range(80)))[:480]
        prompts = [client.tokenize(text)[: 12 if i % 2 == 0 else 6] for i, text in enumerate(TEXTS)]
        assert [len(p) for p in prompts] == [12, 6, 12, 6, 12, 6]
        before = _buckets(server.metrics_port)
        with ThreadPoolExecutor(7) as pool:
            long = pool.submit(client.generate, long_prompt, max_tokens=24, temperature=0, ignore_eos=True)
            _wait_running(server.metrics_port, 1)
            burst = []
            for prompt in prompts:  # in this order: keys, and so slots, alternate 12 and 6
                burst.append(pool.submit(client.generate, prompt, max_tokens=4, temperature=0, top_logprobs=4))
                time.sleep(0.01)
            replies = [f.result() for f in burst]
            long.result()
        after = _buckets(server.metrics_port)
        alone = [client.generate(p, max_tokens=4, temperature=0, top_logprobs=4, prompt_logprobs=True) for p in prompts]
    steps = {le: after[le] - before[le] for le in before}  # generation steps of at most `le` ubatches (tokens)
    assert steps["tokens 64.0"] - steps["tokens 32.0"] == 1 and steps["tokens 32.0"] == steps["tokens 8.0"], \
        f"the burst did not share one step: {steps}"
    assert steps["2.0"] == steps["+Inf"], f"a step of more than 2 ubatches: {steps}"
    assert steps["1.0"] < steps["2.0"], f"no step of 2 ubatches: {steps}"
    for burst_reply, alone_reply in zip(replies, alone):
        parting(burst_reply.logprobs, alone_reply.logprobs)
