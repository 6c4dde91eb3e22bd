"""The executor's shape and settings, as the Engine derives them from the ServerConfig."""

from __future__ import annotations

from dataclasses import dataclass

from ...config import ContextShiftSettings, KVCacheSettings, PrefillSettings, SpeculationSettings


@dataclass(frozen=True)
class ExecutorConfig:
    """The executor's shape (derived by the Engine from the ServerConfig) and the settings
    objects it hands, as they are, to the parts that read them (config.py)."""

    n_parallel: int
    n_ctx_per_slot: int
    n_batch: int
    n_ubatch: int
    max_embed_seqs: int = 64
    reader_timeout_s: float | None = None  # a paused stream whose client reads nothing this long ends; None: never
    prefill: PrefillSettings = PrefillSettings()
    speculation: SpeculationSettings = SpeculationSettings()  # n-gram drafts where they pay, as the server
    kv_cache: KVCacheSettings = KVCacheSettings()  # kv_unified off: one KV stream per slot
    context_shift: ContextShiftSettings = ContextShiftSettings()  # off by default
    lora_names: tuple[str, ...] = ()  # the LoRA adapters the runner loaded at start
    max_loras: int = 8  # resident at once (adapter_residency.py)
