"""Server configuration: what `llmserve serve` was asked for, and what it derives.

Settings that travel below the transport come as one frozen object per concern (`SpeculationSettings`,
`PrefillSettings`, `KVCacheSettings`, `ContextShiftSettings`, `AdapterSettings`, `ModelSettings`). Each field is
named after its flag (`--draft-max` -> `draft_max`); the CLI builds the object from those names and every layer
hands it down unchanged to the code that reads it, so a new flag is its field here, its `add` line in
serve_flags.py, its consumer and its test.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from .model_settings import ModelSettings

TOOL_FORMATS = ("auto", "generic", "hermes", "llama3", "mistral", "mistral-args")  # engine/chat/tool_formats.py
CACHE_TYPES = {  # name -> ggml_type id (ggml.h)
    "f32": 0, "f16": 1, "bf16": 30, "q8_0": 8, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "iq4_nl": 20}
UNQUANTIZED = {"f32", "f16", "bf16"}
FLASH_ATTN = {"auto": -1, "off": 0, "on": 1}
DEFAULT_PARALLEL = 4  # llama-server's auto value (with a unified KV cache)
SPEC_TYPES = ("none", "ngram-simple")
STEP_COSTS = ("measure", "builtin")


@dataclass(frozen=True)
class SpeculationSettings:
    """Speculative decoding (engine/executor/speculation.py): read by the executor (its row budget),
    the DraftVerifier and each sequence's SeqSpeculation. llama-server's flag names."""

    spec_type: str = "ngram-simple"  # none | ngram-simple; drafts only where their rows pay (Scheduler)
    draft_max: int = 16  # most draft tokens per sequence and step
    draft_min: int = 0  # a shorter draft is not worth its rows
    spec_ngram_size_n: int = 3  # tokens matched to find a draft
    spec_max_rows: int = 64  # draft rows one step may carry, all drafting sequences together (drafts while <= 4 decode)

    @property
    def enabled(self) -> bool:
        return self.spec_type != "none" and self.draft_max > 0


@dataclass(frozen=True)
class PrefillSettings:
    """How many prompt tokens a step carries while other sequences decode: read by the
    executor, which gives the Scheduler a fixed budget or runs a PrefillPacer."""

    prefill_budget: int = 0  # prompt tokens per step while sequences decode (0: paced, see PrefillPacer)
    # Paced: the longest gap a decoding stream should see while prompts prefill. None: PrefillPacer.AUTO_ITL_STEPS
    # decode steps, so the gap and the prompts' share of the machine keep their proportions on any hardware
    # (docs/benchmarks.md, "The prefill pacer's knob"); a number of ms is an absolute bound instead.
    max_itl_ms: float | None = None


@dataclass(frozen=True)
class KVCacheSettings:
    """The KV cache's layout and data types: read by the runner (the llama context), the
    executor (`kv_unified`: how slots share streams) and the session store's fingerprint.

    llama.cpp stores V transposed unless flash attention is on, and a transposed V
    cannot be quantized: a quantized V cache needs flash attention. With a quantized
    K or V cache llama.cpp applies a Walsh-Hadamard rotation to K/V (and Q) by itself
    when the head size is a multiple of 64 (`attn_rot_k`/`attn_rot_v` in
    src/llama-kv-cache.cpp; gemma-3-270m's head size is 256), unless the environment
    sets LLAMA_ATTN_ROT_DISABLE."""

    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    flash_attn: str = "auto"
    kv_unified: bool = False  # one KV buffer for all slots (llama-server's -kvu); off: one stream per slot
    # A cell for every position in the sliding-window layers (llama-server's --swa-full). Off, as in llama-server:
    # those layers keep n_swa + n_ubatch cells per stream (60 MiB less at -np 4 -c 8192 for gemma 3); a trimmed
    # prefix that lost window cells is prefilled again (SlotKV.holds_window), as it can be with the full cache too.
    swa_full: bool = False

    def validate(self) -> None:
        """Raise ValueError for a combination llama.cpp cannot run."""
        for flag, value in (("--cache-type-k", self.cache_type_k), ("--cache-type-v", self.cache_type_v)):
            if value not in CACHE_TYPES:
                raise ValueError(f"{flag} {value}: expected one of {', '.join(CACHE_TYPES)}")
        if self.flash_attn not in FLASH_ATTN:
            raise ValueError(f"--flash-attn {self.flash_attn}: expected on, off or auto")
        if self.cache_type_v not in UNQUANTIZED and self.flash_attn == "off":
            raise ValueError(f"a quantized V cache (--cache-type-v {self.cache_type_v}) needs flash attention: "
                             "use --flash-attn on or auto, or an f16 V cache")


@dataclass(frozen=True)
class ContextShiftSettings:
    """What a sample does at its slot's context limit: read by the engine (can the model shift, its Limits), the TokenPicker."""

    context_shift: bool = False  # drop the oldest tokens (after `keep`) and go on; off: the turn ends
    keep: int = 0  # tokens kept at the start on a shift (BOS always kept)

    @property
    def shift_keep(self) -> int | None:
        """`keep` when shifting is on; None: no shifting (what the TokenPicker takes)."""
        return self.keep if self.context_shift else None


@dataclass(frozen=True)
class LoraSpec:
    """An adapter given at start-up: its name in requests, its file, the scale a request gets
    when it names none."""

    name: str
    path: Path
    scale: float = 1.0


def parse_lora(value: str, scaled: bool = False) -> list[LoraSpec]:
    """`--lora NAME=PATH[:SCALE],...` (or llama-server's `--lora PATH,...`, named by the file's
    stem) and `--lora-scaled PATH:SCALE,...`; ValueError names the item it cannot read."""
    specs = []
    for item in filter(None, (part.strip() for part in value.split(","))):
        name, _, rest = item.rpartition("=") if "=" in item else ("", "", item)
        path, _, scale = rest.rpartition(":") if ":" in rest else (rest, "", "")
        if scaled and not scale:
            raise ValueError(f"--lora-scaled {item}: expected PATH:SCALE")
        try:
            specs.append(LoraSpec(name or Path(path).stem, Path(path), float(scale) if scale else 1.0))
        except ValueError:
            raise ValueError(f"--lora {item}: the scale {scale!r} is not a number") from None
    return specs


@dataclass(frozen=True)
class AdapterSettings:
    """LoRA adapters: read by the runner (those loaded at start) and the engine's
    AdapterRegistry (names, run-time loads from `adapter_dir`, residency)."""

    lora: tuple[LoraSpec, ...] = ()
    max_loras: int = 8  # adapters resident at once (llama.cpp's memory); beyond it the least recently used idle one goes
    max_loras_per_batch: int = 4  # adapter sets (adapter, scale) running at once; sessions under a further one wait
    adapter_dir: Path | None = None  # run-time loads read adapter files from under here only
    allow_adapter_updates: bool = False  # LoadAdapter / UnloadAdapter and vLLM's load/unload routes

    def validate(self) -> None:
        names = [spec.name for spec in self.lora]
        if len(set(names)) != len(names):
            raise ValueError(f"--lora: adapter names must differ ({', '.join(names)})")
        for spec in self.lora:
            if not spec.path.is_file():
                raise ValueError(f"--lora {spec.name}={spec.path}: no such file")
        if min(self.max_loras, self.max_loras_per_batch) < 1:  # --lora beyond --max-loras: loaded when first named
            raise ValueError(f"--max-loras {self.max_loras}, --max-loras-per-batch {self.max_loras_per_batch}: at least 1")
        if self.allow_adapter_updates and (self.adapter_dir is None or not self.adapter_dir.is_dir()):
            raise ValueError("--allow-adapter-updates loads adapters from --adapter-dir: give an existing directory")


@dataclass(frozen=True)
class HttpConnectionSettings:
    """How the HTTP surface bounds its connections: read by http/connections.py. aiohttp
    alone would keep a slowly sent request, or an idle connection, open for an hour."""

    timeout: float = 60.0  # a request's headers and body must arrive within this (llama-server's --timeout)
    http_keepalive_timeout: float = 30.0  # a connection with no request this long closes
    http_max_connections: int | None = None  # None: 1024, at most half the open-file limit

    def validate(self) -> None:
        if self.timeout <= 0 or self.http_keepalive_timeout <= 0:
            raise ValueError("--timeout and --http-keepalive-timeout must be positive")
        if self.http_max_connections is not None and self.http_max_connections < 1:
            raise ValueError("--http-max-connections must be at least 1")


@dataclass(frozen=True)
class ServerConfig:
    model_path: Path | None = None  # None: the default PyPI model
    models: ModelSettings = ModelSettings()  # more models beside it (model_settings.py)
    n_ctx: int = 8192  # total KV cells: n_ctx / n_parallel per slot
    n_parallel: int = 4
    n_parallel_auto: bool = False  # -np was not given: llama-server's auto value
    n_batch: int = 2048
    n_ubatch: int = 512
    n_threads: int = 2
    embeddings: bool = False
    embedding_model_path: Path | None = None  # Embed's own model; None: the generative model
    host: str = "127.0.0.1"
    port: int = 50051
    http_port: int | None = None  # the OpenAI HTTP API (http/); None: off
    alias: str | None = None  # the model's name on the HTTP API; None: the model file's stem
    http: HttpConnectionSettings = HttpConnectionSettings()
    max_queue: int = 64  # sessions that may wait for a slot
    n_predict: int = -1  # -n: a turn's max tokens when the request sets none (-1: the slot's context)
    max_input_tokens: int | None = None  # per session; None: the slot's context
    deterministic: bool = False  # sessions decode batch-invariant unless they ask not to (canonical_chunks.py)
    max_message_bytes: int = 16 * 1024 * 1024
    shutdown_grace_s: float = 10.0
    drain_delay_s: float = 0.0  # on SIGTERM: not ready but still serving this long (load balancers' view)
    first_message_timeout_s: float = 5.0  # a Generate stream's first message must come by then
    reader_timeout_s: float = 60.0  # a stream whose client reads nothing this long ends (0: never)
    watchdog_timeout_s: float = 60.0  # no executor progress this long with work waiting: exit (0: off)
    keepalive_time_s: float = 60.0  # the server pings an idle connection this often
    keepalive_timeout_s: float = 20.0  # and drops it if the ping is not answered in time
    keepalive_min_time_s: float = 10.0  # clients pinging more often get GOAWAY (too_many_pings)
    keepalive_permit_without_calls: bool = True  # clients may ping with no call open
    max_connection_age_s: float = 1800.0  # GOAWAY after this long, so clients rebalance (0: never)
    max_connection_age_grace_s: float = 600.0  # calls in flight then have this long to finish
    grammar_timeout_s: float = 5.0  # compile budget of a grammar / JSON schema (in the grammar worker)
    grammar_max_mb: int = 512
    prefill: PrefillSettings = PrefillSettings()
    speculation: SpeculationSettings = SpeculationSettings()
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = None
    otlp_traces_endpoint: str | None = None  # OpenTelemetry traces over OTLP/gRPC; None: tracing off
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    api_key: str | None = None
    chat_template_file: Path | None = None
    tool_format: str = "auto"  # engine/chat/tool_formats.py NAMES: auto picks the chat template's
    kv_cache: KVCacheSettings = KVCacheSettings()
    step_costs: str = "measure"  # what a step costs by rows: timed at start-up (cached), or "builtin"
    context_shift: ContextShiftSettings = ContextShiftSettings()
    adapters: AdapterSettings = AdapterSettings()
    session_dir: Path | None = None
    session_dir_max_bytes: int = 1 << 30
    store_kv: bool = False  # with session_dir: a stored response's KV is saved with it (engine/stored_kv.py)
    verbose: bool = False
    log_format: str = "auto"

    @property
    def n_batch_effective(self) -> int:
        """llama-server's rule: with embeddings on, a batch is one ubatch (on an embedding model's own context only)."""
        shares_model = self.embeddings and self.embedding_model_path is None
        return min(self.n_batch, self.n_ubatch) if shares_model else self.n_batch

    @property
    def n_ctx_per_slot(self) -> int:
        return self.n_ctx // self.n_parallel

    def validate(self) -> None:
        """Raise ValueError naming the flag of a setting that cannot run."""
        self._validate_shape()
        self._validate_serving()
        self.http.validate()
        self.kv_cache.validate()
        if self.deterministic and self.kv_cache.kv_unified:
            raise ValueError("--deterministic needs one KV stream per slot (the default): with --kv-unified a "
                             "session's cells sit among the others' and its output moves with theirs")
        self.adapters.validate()
        self.models.validate(self.alias or (self.model_path.stem if self.model_path else None),
                             tuple(spec.name for spec in self.adapters.lora))
        for model in (m for m in self.models.extra if m.n_ctx or m.n_parallel):  # its own -c/-np: the same rules
            try:
                replace(self, **model.shape(self.n_ctx, self.n_parallel), models=ModelSettings()).validate()
            except ValueError as exc:
                raise ValueError(f"--model {model.name}=...: {exc}") from None
        if self.store_kv and self.session_dir is None:
            raise ValueError("--store-kv saves stored responses' KV under --session-dir: give one")
        if self.context_shift.keep < 0 or self.context_shift.keep >= self.n_ctx_per_slot // 2:
            raise ValueError(f"--keep must be in [0, {self.n_ctx_per_slot // 2}) (half a slot's context)")

    def _validate_shape(self) -> None:
        if self.n_parallel < 1:
            raise ValueError("--parallel must be at least 1")
        if self.n_ubatch < 1 or self.n_batch < 1:
            raise ValueError("--batch-size and --ubatch-size must be positive")
        if self.n_batch_effective < self.n_parallel:  # llama.cpp reserves an output per slot in one batch, or aborts
            flag = (f"--batch-size {self.n_batch}" if self.n_batch_effective == self.n_batch else
                    f"--ubatch-size {self.n_ubatch} (with --embeddings a batch is one ubatch)")
            raise ValueError(f"{flag} is smaller than --parallel {self.n_parallel}: a batch must hold a token "
                             f"of every slot; use at least {self.n_parallel}")
        if self.n_ctx_per_slot < 16:
            raise ValueError(f"--ctx-size {self.n_ctx} leaves fewer than 16 tokens per slot")
        if self.n_threads < 1:
            raise ValueError("--threads must be at least 1")
        if self.step_costs not in STEP_COSTS or self.tool_format not in TOOL_FORMATS:
            raise ValueError(f"--step-costs {self.step_costs}, --tool-format {self.tool_format}: expected measure or "
                             f"builtin, and one of {', '.join(TOOL_FORMATS)}")
        if self.first_message_timeout_s <= 0 or self.grammar_timeout_s <= 0 or self.grammar_max_mb < 16:
            raise ValueError("--first-message-timeout and --grammar-timeout must be positive, --grammar-max-mb >= 16")
        spec, prefill = self.speculation, self.prefill
        if spec.spec_type not in SPEC_TYPES:
            raise ValueError(f"--spec-type {spec.spec_type}: expected none or ngram-simple")
        if spec.draft_max < 0 or spec.draft_min < 0 or spec.spec_ngram_size_n < 1 or prefill.prefill_budget < 0:
            raise ValueError("--draft-max, --draft-min, --prefill-budget must be >= 0, --spec-ngram-size-n >= 1")
        if prefill.max_itl_ms is not None and prefill.max_itl_ms <= 0:
            raise ValueError("--max-itl-ms must be > 0")

    def _validate_serving(self) -> None:
        if min(self.watchdog_timeout_s, self.reader_timeout_s, self.drain_delay_s, self.shutdown_grace_s) < 0:
            raise ValueError("--watchdog-timeout, --reader-timeout, --drain-delay and --shutdown-grace must be >= 0")
        if min(self.keepalive_time_s, self.keepalive_timeout_s, self.keepalive_min_time_s) <= 0 or min(
            self.max_connection_age_s, self.max_connection_age_grace_s) < 0:
            raise ValueError("--keepalive-* must be positive, --max-connection-age(-grace) >= 0")
        if self.http_port is not None and (not 0 < self.http_port < 65536 or self.http_port == self.port):
            raise ValueError(f"--http-port {self.http_port}: expected a port in 1..65535 other than --port")
        if self.max_queue < 0 or self.n_predict < -1 or self.n_predict == 0:
            raise ValueError("--max-queue must be >= 0, --n-predict -1 (none) or positive")
        if self.max_input_tokens is not None and self.max_input_tokens < 1:
            raise ValueError("--max-input-tokens must be positive")
        if (self.tls_cert is None) != (self.tls_key is None) or (self.tls_client_ca and self.tls_cert is None):
            raise ValueError("--tls-cert and --tls-key go together; --tls-client-ca needs them")
        for flag, path in (("--model", self.model_path), ("--embedding-model", self.embedding_model_path)):
            if path is not None and not path.is_file():
                raise ValueError(f"{flag} {path}: no such file")
        if self.embedding_model_path is not None and not self.embeddings:
            raise ValueError("--embedding-model serves Embed: it needs embeddings on")
