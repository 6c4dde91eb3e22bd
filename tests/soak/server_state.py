"""What a soak reads of the server's state after a run: slots idle, llama.cpp's KV matching the
slots' cached prefixes (its RSS and threads: harness/server.py; its Prometheus samples: harness/metrics.py)."""

from __future__ import annotations

import time

from llmserve.client import Client, pb


def wait_until_idle(address: str, timeout: float = 30.0, model: str = "") -> pb.ModelInfo:
    """The model's info once its slots are idle and nothing waits ("" the default model)."""
    deadline = time.monotonic() + timeout
    with Client(address, timeout=10) as client:
        while True:
            info = client.model_info(model)
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
