"""Prometheus metrics (prometheus-client), all named `llmserve_*`.

One `Metrics` object per server, on its own registry; the executor records
steps, batch sizes, inter-token latency and slot gauges, the transport records
requests, turns and tokens. Served on `--metrics-port` when set.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        self.requests = Counter("llmserve_requests", "Finished RPCs by method and status code", ["rpc", "code"], registry=r)
        self.turns = Counter("llmserve_turns", "Finished Generate turns by finish reason", ["finish_reason"], registry=r)
        self.prompt_tokens = Counter("llmserve_prompt_tokens", "Input tokens of finished turns", registry=r)
        self.cached_tokens = Counter("llmserve_cached_tokens", "Input tokens served from the KV cache", registry=r)
        self.generated_tokens = Counter("llmserve_generated_tokens", "Tokens sampled", registry=r)
        self.embeddings = Counter("llmserve_embeddings", "Embedding inputs computed", registry=r)
        self.embedding_tokens = Counter("llmserve_embedding_tokens", "Tokens of embedding inputs", registry=r)
        self.ttft = Histogram(
            "llmserve_time_to_first_token_seconds", "End of input to first token", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.itl = Histogram(
            "llmserve_inter_token_latency_seconds", "Time between a session's tokens", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.step_duration = Histogram(
            "llmserve_step_duration_seconds", "Executor step (one llama_decode) duration", ["kind"],
            buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.batch_tokens = Histogram(
            "llmserve_batch_tokens", "Tokens per executor step", ["kind"], buckets=_TOKEN_BUCKETS, registry=r
        )
        self.slots = Gauge("llmserve_slots", "KV slots by state", ["state"], registry=r)
        self.waiting = Gauge("llmserve_waiting_sessions", "Sessions waiting for a slot", registry=r)
        self.sessions = Gauge("llmserve_sessions", "Open Generate sessions", registry=r)
        self.context_shifts = Counter("llmserve_context_shifts", "Context shifts (oldest tokens dropped)", registry=r)
        self.slot_tokens = Gauge("llmserve_slot_kv_tokens", "Tokens in the KV per slot", ["slot"], registry=r)
        self.session_cache = Counter(
            "llmserve_session_cache", "Saved-session lookups and writes", ["result"], registry=r
        )
        self.session_cache_bytes = Gauge("llmserve_session_cache_bytes", "Bytes of saved sessions on disk", registry=r)
        self.spec_draft_tokens = Counter("llmserve_spec_draft_tokens", "Speculative draft tokens verified", registry=r)
        self.spec_accepted_tokens = Counter(
            "llmserve_spec_accepted_tokens", "Speculative draft tokens accepted", registry=r
        )
        self.kv_used = Gauge("llmserve_kv_cells_used_ratio", "KV cells holding tokens / generation cells", registry=r)

    def observe_snapshot(self, snapshot: Any, num_cells: int) -> None:
        """Slot, queue and KV gauges from the executor's published snapshot."""
        num_busy = sum(slot.busy for slot in snapshot.slots)
        self.slots.labels("busy").set(num_busy)
        self.slots.labels("idle").set(len(snapshot.slots) - num_busy)
        self.waiting.set(snapshot.num_waiting)
        for slot in snapshot.slots:
            self.slot_tokens.labels(str(slot.seq_id)).set(slot.num_cached_tokens)
        self.kv_used.set(snapshot.num_kv_tokens / num_cells)

    def serve(self, host: str, port: int) -> None:
        start_http_server(port, addr=host, registry=self.registry)
