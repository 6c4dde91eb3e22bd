"""What a soak reads of the server's state after a run: slots idle, llama.cpp's KV matching the
slots' cached prefixes, RSS and threads, and Prometheus samples (the fuzzers and many tests share these)."""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

from llmserve.client import Client, pb
from prometheus_client.parser import text_string_to_metric_families


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


def counter(port: int, name: str, **labels: str) -> float:
    """A counter's sample (`name` with its `_total`) with exactly these labels; 0 when no such
    sample exists yet (prometheus_client exports a labelled counter only once it has counted)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return 0.0
