"""Prometheus metrics (prometheus-client): `llmserve_*`, `grpc_server_*`, `process_*`.

One `Metrics` object per server, on its own registry; the executor records
steps, batch sizes, inter-token latency and slot gauges, each transport wing records
its turns and tokens (`observe_turn`: the per-turn histograms carry `surface`, "grpc"
or "http"), `transport/rpc_metrics.py` every RPC (the go-grpc-prometheus names, so
stock gRPC dashboards work) and `http/telemetry.py` every HTTP request. `process_*` and
`python_*` come from prometheus-client's own collectors. Served on `--metrics-port`.

The Gateway API Inference Extension's model server protocol reads three gauges, all
from the executor, so both surfaces count: queued requests `llmserve_waiting_sessions`,
running requests `llmserve_running_sessions`, KV-cache utilization (0..1)
`llmserve_kv_cells_used_ratio` (docs/observability.md). The load that ORCA reports to
Envoy is here too: `llmserve_load_utilization`, `llmserve_prefill_tokens_waiting`,
`llmserve_slot_wait_seconds`. With LoRA adapters, `llmserve_lora_requests_info` is vLLM's
`vllm:lora_requests_info` by another name (the gateway's lora-affinity scorer).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    start_http_server,
)
from prometheus_client.metrics_core import Metric

_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
_UBATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 16)
_REQUEST_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_REQUEST_TOKEN_BUCKETS = (1, 4, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
SURFACES = ("grpc", "http")  # the `surface` label: which wing served the turn


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            r.register(collector)
        self.model = Info("llmserve_model", "The model served, its quantization and context", registry=r)
        self.requests = Counter("llmserve_requests", "Finished RPCs by method and status code", ["rpc", "code"], registry=r)
        self.turns = Counter("llmserve_turns", "Finished Generate turns by finish reason", ["finish_reason"], registry=r)
        self.prompt_tokens = Counter("llmserve_prompt_tokens", "Input tokens of finished turns", registry=r)
        self.cached_tokens = Counter("llmserve_cached_tokens", "Input tokens served from the KV cache", registry=r)
        self.generated_tokens = Counter("llmserve_generated_tokens", "Tokens sampled", registry=r)
        self.embeddings = Counter("llmserve_embeddings", "Embedding inputs computed", registry=r)
        self.embedding_tokens = Counter("llmserve_embedding_tokens", "Tokens of embedding inputs", registry=r)
        self._add_turn_metrics(r)
        self._add_http_metrics(r)
        self._add_rpc_metrics(r)
        self._add_executor_metrics(r)
        self._add_cache_metrics(r)
        self._add_load_metrics(r)
        self.models: dict[str, Metrics] = {}  # further models' (add_model), by name
        self.max_loras = 0  # adapters that can run at once (the Engine sets it): the lora_requests_info gauge's max_lora
        for histogram in (self.ttft, self.itl, self.queue_time, self.turn_duration, self.turn_prompt_tokens,
                          self.turn_generated_tokens):
            for name in SURFACES:  # exported at zero from the start, so that dashboards find both
                histogram.labels(name)

    def _add_turn_metrics(self, r: CollectorRegistry) -> None:
        """Per turn, labelled by the surface that served it."""
        surface = ["surface"]
        self.ttft = Histogram(
            "llmserve_time_to_first_token_seconds", "End of input to first token", surface,
            buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.queue_time = Histogram(
            "llmserve_queue_time_seconds", "Session open to slot assigned", surface, buckets=_REQUEST_BUCKETS, registry=r
        )
        self.turn_duration = Histogram(
            "llmserve_turn_duration_seconds", "End of a turn's input to its end (each sample)", surface,
            buckets=_REQUEST_BUCKETS, registry=r,
        )
        self.turn_prompt_tokens = Histogram(
            "llmserve_turn_prompt_tokens", "Input tokens per turn", surface, buckets=_REQUEST_TOKEN_BUCKETS, registry=r
        )
        self.turn_generated_tokens = Histogram(
            "llmserve_turn_generated_tokens", "Tokens sampled per turn (each sample)", surface,
            buckets=_REQUEST_TOKEN_BUCKETS, registry=r,
        )
        self.itl = Histogram(
            "llmserve_inter_token_latency_seconds", "Time between a session's tokens", surface,
            buckets=_LATENCY_BUCKETS, registry=r,
        )

    def _add_http_metrics(self, r: CollectorRegistry) -> None:
        self.http_requests = Counter(
            "llmserve_http_requests", "Finished HTTP requests by route template (unknown paths: other), method and "
            "status code", ["route", "method", "status"], registry=r,
        )
        self.http_connections = Gauge("llmserve_http_connections", "Open HTTP connections (http/connections.py)",
                                      registry=r)
        self.http_connections_closed = Counter(
            "llmserve_http_connections_closed", "HTTP connections the server closed: refused (over "
            "--http-max-connections), idle, header_timeout, body_timeout, write_timeout", ["reason"], registry=r,
        )
        self.http_seconds = Histogram(
            "llmserve_http_request_duration_seconds", "HTTP request start to end (a stream's last byte)", ["route"],
            buckets=_REQUEST_BUCKETS, registry=r,
        )

    def _add_rpc_metrics(self, r: CollectorRegistry) -> None:
        """The go-grpc-prometheus names (transport/rpc_metrics.py)."""
        self.rpc_started = Counter(
            "grpc_server_started", "RPCs started", ["grpc_type", "grpc_service", "grpc_method"], registry=r
        )
        self.rpc_handled = Counter(
            "grpc_server_handled", "RPCs completed, by status code",
            ["grpc_type", "grpc_service", "grpc_method", "grpc_code"], registry=r,
        )
        self.rpc_seconds = Histogram(
            "grpc_server_handling_seconds", "RPC start to end", ["grpc_type", "grpc_service", "grpc_method"],
            buckets=_REQUEST_BUCKETS, registry=r,
        )

    def _add_executor_metrics(self, r: CollectorRegistry) -> None:
        """Steps, slots and sessions, as the executor sees them (both surfaces)."""
        self.step_duration = Histogram(
            "llmserve_step_duration_seconds", "Executor step (one llama_decode) duration", ["kind"],
            buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.batch_tokens = Histogram(
            "llmserve_batch_tokens", "Tokens per executor step", ["kind"], buckets=_TOKEN_BUCKETS, registry=r
        )
        self.step_ubatches = Histogram(
            "llmserve_step_ubatches", "Ubatches (graph runs, each a pass over every weight) llama_decode made of a "
            "generation step's batch", buckets=_UBATCH_BUCKETS, registry=r,
        )
        self.slots = Gauge("llmserve_slots", "KV slots by state", ["state"], registry=r)
        self.waiting = Gauge("llmserve_waiting_sessions", "Sessions waiting for a slot (both surfaces)", registry=r)
        self.running = Gauge(
            "llmserve_running_sessions", "Sessions holding a slot (both surfaces; with n > 1 still one)", registry=r
        )
        self.sessions = Gauge("llmserve_sessions", "Open sessions of both surfaces (admitted, waiting or running)",
                              registry=r)
        self.preemptions = Counter(
            "llmserve_preemptions", "Slots given up to waiting calls, by why the holder could give it (paused, idle)",
            ["reason"], registry=r,
        )
        self.context_shifts = Counter("llmserve_context_shifts", "Context shifts (oldest tokens dropped)", registry=r)
        self.slot_tokens = Gauge("llmserve_slot_kv_tokens", "Tokens in the KV per slot", ["slot"], registry=r)
        self.kv_used = Gauge("llmserve_kv_cells_used_ratio", "KV cells holding tokens / generation cells", registry=r)
        self.spec_draft_tokens = Counter("llmserve_spec_draft_tokens", "Speculative draft tokens verified", registry=r)
        self.spec_accepted_tokens = Counter(
            "llmserve_spec_accepted_tokens", "Speculative draft tokens accepted", registry=r
        )

    def _add_cache_metrics(self, r: CollectorRegistry) -> None:
        """Saved sessions and compiled constraints."""
        self.session_cache = Counter(
            "llmserve_session_cache", "Saved-session lookups and writes", ["result"], registry=r
        )
        self.session_cache_bytes = Gauge("llmserve_session_cache_bytes", "Bytes of saved sessions on disk", registry=r)
        self.constraint_cache = Counter(
            "llmserve_constraint_cache", "Grammar / JSON schema compiles: hit (kept), shared (joined one running), "
            "miss (compiled), refused (too many waiting)", ["result"], registry=r,
        )
        self.session_dir_ok = Gauge(
            "llmserve_session_dir_ok", "1 while --session-dir works, 0 after it failed until a save works", registry=r
        )

    def _add_load_metrics(self, r: CollectorRegistry) -> None:
        """What the inference gateway and ORCA read (docs/observability.md)."""
        self.lora_info = Gauge("llmserve_lora_requests_info", "LoRA adapters of running and waiting sessions, as "
                               "vLLM's vllm:lora_requests_info (the inference gateway's lora-affinity scorer reads "
                               "it); the value is when it was set", ["running_lora_adapters", "waiting_lora_adapters",
                                                                     "max_lora"], registry=r)
        self.prefill_waiting = Gauge("llmserve_prefill_tokens_waiting", "Input tokens of open sessions not yet in the KV",
                                     registry=r)
        self.utilization = Gauge("llmserve_load_utilization", "Load as a fraction of what the replica admits, as "
                                 "ORCA reports it (domain/load.py; sampled every 0.1 s)", registry=r)
        self.slot_wait = Gauge("llmserve_slot_wait_seconds", "Until a call arriving now would get a slot, as the "
                               "turns in progress' limits tell (domain/load.py; sampled every 0.1 s)", registry=r)

    def observe_step(self, kind: str, elapsed_s: float, num_tokens: int, num_ubatches: int) -> None:
        """One executor step: its time and tokens; a generation step's ubatches too."""
        self.step_duration.labels(kind).observe(elapsed_s)
        self.batch_tokens.labels(kind).observe(num_tokens)
        if num_ubatches:
            self.step_ubatches.observe(num_ubatches)

    def describe_model(self, meta: Any, n_ctx: int, n_parallel: int, version: str) -> None:
        """`llmserve_model_info{model=..., quantization=..., ...} 1`, for dashboards to join on."""
        self.model.info({
            "model": meta.name, "architecture": meta.architecture, "quantization": meta.quantization,
            "n_ctx": str(n_ctx), "n_parallel": str(n_parallel), "version": version,
        })

    def observe_turn(self, event: Any, surface: str) -> None:
        """A finished turn's counters and histograms (`event`: a TurnEndEvent; `surface`:
        one of SURFACES)."""
        self.turns.labels(event.finish_reason.name).inc()
        self.prompt_tokens.inc(event.prompt_tokens)
        self.cached_tokens.inc(event.cached_tokens)
        self.generated_tokens.inc(event.completion_tokens)
        if event.completion_tokens:
            self.ttft.labels(surface).observe(event.ttft_ms / 1000.0)
        if event.queue_ms > 0 and event.index == 0:  # set on a session's first turn only
            self.queue_time.labels(surface).observe(event.queue_ms / 1000.0)
        self.turn_duration.labels(surface).observe((event.ttft_ms + event.decode_ms) / 1000.0)
        self.turn_prompt_tokens.labels(surface).observe(event.prompt_tokens)
        self.turn_generated_tokens.labels(surface).observe(event.completion_tokens)

    def observe_snapshot(self, snapshot: Any, num_cells: int) -> None:
        """Slot, queue and KV gauges from the executor's published snapshot."""
        num_busy = sum(slot.busy for slot in snapshot.slots)
        self.slots.labels("busy").set(num_busy)
        self.slots.labels("idle").set(len(snapshot.slots) - num_busy)
        self.waiting.set(snapshot.num_waiting)
        self.running.set(snapshot.num_sessions - snapshot.num_waiting)
        for slot in snapshot.slots:
            self.slot_tokens.labels(str(slot.seq_id)).set(slot.num_cached_tokens)
        self.kv_used.set(snapshot.num_kv_tokens / num_cells)
        self.prefill_waiting.set(snapshot.num_prefill_tokens_waiting)
        if snapshot.adapter_sessions:
            running = ",".join(name for name, num_running, _ in snapshot.adapter_sessions if num_running)
            waiting = ",".join(name for name, _, num_waiting in snapshot.adapter_sessions if num_waiting)
            self.lora_info.clear()
            self.lora_info.labels(running, waiting, str(self.max_loras)).set(time.time())

    def add_model(self, name: str, metrics: Metrics) -> None:
        """A further model's executor and turns (served_models.py), served among these."""
        self.models[name] = metrics

    def exposed(self) -> CollectorRegistry:
        """What /metrics shows: these metrics and the further models' (`_WithModels`)."""
        exposed = CollectorRegistry()
        exposed.register(_WithModels(self))
        return exposed

    def serve(self, host: str, port: int) -> None:
        start_http_server(port, addr=host, registry=self.exposed())


class _WithModels:
    """The server's metrics; each further model's samples join the same families with a
    `model_name` label (vLLM's), the default model's and the process's have none."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        others = [(name, {f.name: f for f in m.registry.collect()}) for name, m in self._metrics.models.items()]
        for family in self._metrics.registry.collect():
            if not family.name.startswith(("process_", "python_")):
                for name, families in others:
                    if (other := families.get(family.name)) is not None:
                        family.samples.extend(s._replace(labels={**s.labels, "model_name": name})
                                              for s in other.samples)
            yield family
