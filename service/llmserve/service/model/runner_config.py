"""What the llama.cpp runner is built with (LlamaRunner; its start-up step timing reads it too)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..config import KVCacheSettings, LoraSpec


@dataclass(frozen=True)
class RunnerConfig:
    model_path: Path
    n_ctx: int  # KV cells for generation, shared by all slots
    n_parallel: int
    n_batch: int
    n_ubatch: int
    n_threads: int
    embeddings: bool
    embedding_model_path: Path | None = None  # None: the generative model's hidden states
    max_embed_seqs: int = 64
    verbose: bool = False
    kv_cache: KVCacheSettings = KVCacheSettings()  # kv_unified off: one KV stream per slot (llama-server without -kvu)
    step_costs: str = "measure"  # measure (cached per machine: step_timing.py) or builtin (the repack shape)
    lora: tuple[LoraSpec, ...] = ()  # LoRA adapters loaded at start (model/adapters.py)
