"""The flags of `llmserve serve` beyond the model's (model_flags.py), in groups; each is
`ServerConfig`'s field of the same name (cli.build_config maps them)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from llmserve.client.envflags import EnvFlags

from .config import CACHE_TYPES, DEFAULT_PARALLEL, TOOL_FORMATS, ServerConfig


def add_serving_flags(f: EnvFlags, d: ServerConfig) -> None:
    """The serve command's flags: slots, batches, listeners and per-request limits."""
    f.add("-c", "--ctx-size", type=int, default=d.n_ctx, help="total KV context; each slot gets ctx-size / parallel")
    f.add("-np", "--parallel", type=int, help=f"slots: sessions served at once (unset: {DEFAULT_PARALLEL}, llama-server's auto)")
    f.add("-b", "--batch-size", type=int, default=d.n_batch, help="logical batch: max tokens per step")
    f.add("-ub", "--ubatch-size", type=int, default=d.n_ubatch, help="physical batch; the max embedding input")
    f.add("-t", "--threads", type=int, default=min(os.cpu_count() or 2, 8), help="CPU threads for llama.cpp")
    f.add("--host", default=d.host, help="address to listen on")
    f.add("--port", type=int, default=d.port, help="gRPC port")
    f.add("--http-port", type=int, help="also serve the OpenAI HTTP API (/v1/chat/completions, /v1/models, /health) "
          "on this port, at --host (off when unset)")
    f.add("-to", "--timeout", type=float, default=d.http.timeout,
          help="HTTP: seconds a request's headers and body may take to arrive, and a reply may sit unread between "
               "requests (then 408 and the connection closes; a response stream is not bounded by it)")
    f.add("--http-keepalive-timeout", type=float, default=d.http.http_keepalive_timeout,
          help="HTTP: seconds a connection may stay open without a request")
    f.add("--http-max-connections", type=int,
          help="HTTP: most connections open at once; more are answered 503 and closed (default: 1024, at most "
               "half the open-file limit)")
    f.add("--alias", help="the model's name on the HTTP API (default: the model file's stem)")
    f.switch("--embeddings", help="serve Embed (clamps the batch to one ubatch)")
    f.add("--embedding-model", type=Path, help="GGUF embedding model for Embed (its own context; implies --embeddings)")
    f.add("--max-queue", type=int, default=d.max_queue, help="sessions that may wait for a slot; more get RESOURCE_EXHAUSTED")
    f.add("-n", "--n-predict", "--predict", type=int, default=d.n_predict,
          help="a turn's max tokens when the request sets none (-1: until the slot's context is full)")
    f.add("--max-input-tokens", type=int, help="input tokens per session (default and cap: the slot's context)")
    f.switch("--deterministic",
             help="every session decodes batch-invariant (greedy output a function of its transcript alone) "
                  "unless it sets deterministic false; see docs/deterministic.md")
    f.add("--max-message-bytes", type=int, default=d.max_message_bytes, help="largest request message accepted")


def add_lifecycle_flags(f: EnvFlags, d: ServerConfig) -> None:
    """The serve command's flags: shutdown, stream timeouts, the watchdog and gRPC connections."""
    f.add("--shutdown-grace", type=float, default=d.shutdown_grace_s, help="seconds in-flight turns get on SIGTERM")
    f.add("--drain-delay", type=float, default=d.drain_delay_s,
          help="on SIGTERM, seconds the server still takes new calls after readiness turns NOT_SERVING, so that "
               "load balancers stop routing to it first (behind the shipped Envoy config: 8); then it refuses them")
    f.add("--first-message-timeout", type=float, default=d.first_message_timeout_s,
          help="seconds a Generate stream may take to send its first message (then DEADLINE_EXCEEDED)")
    f.add("--reader-timeout", type=float, default=d.reader_timeout_s,
          help="seconds a Generate stream's client may read nothing while its reply waits (then DEADLINE_EXCEEDED; 0: never)")
    f.add("--watchdog-timeout", type=float, default=d.watchdog_timeout_s,
          help="exit non-zero if the executor does not step for this long while work waits (0: off)")
    f.add("--keepalive-time", type=float, default=d.keepalive_time_s, help="seconds between the server's pings")
    f.add("--keepalive-timeout", type=float, default=d.keepalive_timeout_s, help="seconds a ping may go unanswered")
    f.add("--keepalive-min-time", type=float, default=d.keepalive_min_time_s,
          help="shortest client ping interval accepted (more often: GOAWAY too_many_pings)")
    f.switch("--no-keepalive-permit-without-calls", help="refuse client pings while no call is open")
    f.add("--max-connection-age", type=float, default=d.max_connection_age_s,
          help="seconds before a connection is asked to go away, so clients rebalance (0: never)")
    f.add("--max-connection-age-grace", type=float, default=d.max_connection_age_grace_s,
          help="seconds the calls in flight then get before the connection closes")


def add_step_flags(f: EnvFlags, d: ServerConfig) -> None:
    """The serve command's flags: what a step carries: paced prefill, speculation, constraints."""
    spec = d.speculation
    prefill = d.prefill
    f.add("--prefill-budget", type=int, default=prefill.prefill_budget,
          help="prompt tokens a step may carry while other sequences decode (0: paced by --max-itl-ms)")
    f.add("--max-itl-ms", type=float, default=prefill.max_itl_ms,
          help="paced prefill: the longest gap a decoding stream should see while prompts prefill "
               "(higher: long prompts finish sooner, streams stutter more; default: 12 decode steps)")
    f.add("--spec-type", default=spec.spec_type, help="speculative decoding: none or ngram-simple (n-gram drafts)")
    f.add("--draft-max", type=int, default=spec.draft_max, help="most draft tokens per sequence and step")
    f.add("--draft-min", type=int, default=spec.draft_min, help="fewest draft tokens worth verifying")
    f.add("--spec-ngram-size-n", type=int, default=spec.spec_ngram_size_n, help="tokens matched to find a draft")
    f.add("--spec-max-rows", type=int, default=spec.spec_max_rows,
          help="draft rows per step, all drafting sequences together (no drafts with more than 4 decoding)")
    f.add("--grammar-timeout", type=float, default=d.grammar_timeout_s, help="seconds to compile a grammar or schema")
    f.add("--grammar-max-mb", type=int, default=d.grammar_max_mb, help="memory a grammar or schema may take to compile")


def add_ops_flags(f: EnvFlags, d: ServerConfig) -> None:
    """The serve command's flags: metrics, tracing, TLS and auth, the KV cache and context shift."""
    kv = d.kv_cache
    shift = d.context_shift
    f.add("--metrics-port", type=int, help="serve Prometheus metrics on this port (off when unset)")
    f.add("--metrics-host", default=d.metrics_host, help="address for the metrics endpoint")
    f.add("--otlp-traces-endpoint", help="export OpenTelemetry traces over OTLP/gRPC to this collector, "
          "e.g. http://localhost:4317 (https:// for TLS; off when unset)")
    f.add("--tls-cert", type=Path, help="server certificate (PEM); enables TLS with --tls-key")
    f.add("--tls-key", type=Path, help="server private key (PEM)")
    f.add("--tls-client-ca", type=Path, help="CA (PEM) for client certificates: requires mTLS")
    f.add("--api-key", help="require 'authorization: Bearer <key>' on every RPC but health")
    f.add("-ctk", "--cache-type-k", default=kv.cache_type_k, help=f"K cache type: {', '.join(CACHE_TYPES)}")
    f.add("-ctv", "--cache-type-v", default=kv.cache_type_v, help="V cache type (quantized V needs flash attention)")
    f.add("-fa", "--flash-attn", default=kv.flash_attn, help="flash attention: on, off or auto")
    f.switch("-kvu", "--kv-unified", help="one KV buffer shared by all slots (default: one stream per slot, "
             "so a prompt attends only to its own slot's cells)")
    f.switch("--swa-full", help="a full-size cache for sliding-window layers (default: n_swa + n_ubatch cells "
             "per slot; a trimmed prefix that left the window is prefilled again)")
    f.add("--step-costs", default=d.step_costs,
          help="what a decode step costs by its rows (prices drafts and slot choice): measure = time llama_decode at "
               "start-up once per model, CPU and threads, cached under $LLMSERVE_CACHE_DIR/step-costs; builtin = the "
               "repack-kernel shape of one 2-core machine")
    f.switch("--context-shift", help="at a slot's context limit drop the oldest tokens (after --keep) and go on")
    f.add("--keep", type=int, default=shift.keep, help="tokens kept at the start on a context shift (BOS always kept)")


def add_state_flags(f: EnvFlags, d: ServerConfig, serve: argparse.ArgumentParser) -> None:
    """The serve command's flags: adapters, saved sessions, chat templates and logs."""
    serve.add_argument("--lora", action="append", default=[], metavar="NAME=PATH[:SCALE]",
                       help="a LoRA adapter requests may name (repeat, or comma-separate; PATH alone: named by its stem; "
                            "SCALE: a request's scale when it names none)")
    serve.add_argument("--lora-scaled", action="append", default=[], metavar="PATH:SCALE", help="llama-server's form")
    f.add("--max-loras", type=int, default=d.adapters.max_loras, help="LoRA adapters resident at once (LRU beyond)")
    f.add("--max-loras-per-batch", type=int, default=d.adapters.max_loras_per_batch,
          help="adapter sets (adapter and scale) running at once; sessions under a further one wait (SGLang's flag)")
    f.add("--adapter-dir", type=Path, help="run-time adapter loads read files under this directory only")
    f.switch("--allow-adapter-updates", help="serve LoadAdapter/UnloadAdapter and POST /v1/(un)load_lora_adapter")
    f.add("--session-dir", type=Path, help="save sessions with a session_id here, to restore them after a restart")
    f.add("--session-dir-max-bytes", type=int, default=d.session_dir_max_bytes, help="size cap of --session-dir (LRU)")
    f.switch("--store-kv", help="with --session-dir: save a stored response's KV with it, so that "
          "a continuation after a restart prefills only its new input (costs a copy of the turn's KV as it ends)")
    f.add("--chat-template-file", type=Path, help="jinja2 chat template overriding the model's")
    f.add("--tool-format", default=d.tool_format,
          help=f"{'|'.join(TOOL_FORMATS)}: tool calls in the model's own syntax (hermes, llama3, mistral, mistral-args), the generic JSON "
               "format, or auto: the chat template's, generic when it declares none")
    f.add("--log-format", default=d.log_format, help="json, console, or auto (console on a TTY)")
    f.switch("-v", "--verbose", help="debug logs, including llama.cpp's info lines")
