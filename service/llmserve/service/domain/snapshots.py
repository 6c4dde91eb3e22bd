"""State captured at a moment: a named session as saved, the executor's slots after a step."""

from __future__ import annotations

from dataclasses import dataclass

from .requests import AdapterSet


@dataclass(frozen=True)
class SavedSession:
    """A named session's state: what its KV holds, and the KV bytes."""

    session_id: str
    tokens: tuple[int, ...]  # the KV holds these, at positions 0..n-1
    pending: tuple[int, ...]  # sampled or sent, not yet in the KV
    chat: tuple[tuple[str, str], ...] | None
    state: bytes
    adapters: AdapterSet = ()  # the LoRA adapters its KV was computed under


@dataclass(frozen=True)
class SlotSnapshot:
    seq_id: int
    busy: bool
    num_cached_tokens: int
    paused: bool = False
    kv_pos_min: int = -1  # from llama.cpp's memory, for leak checks
    kv_pos_max: int = -1


@dataclass(frozen=True)
class ExecutorSnapshot:
    """Published by the executor after every step; read from any thread."""

    slots: tuple[SlotSnapshot, ...] = ()
    num_sessions: int = 0
    num_waiting: int = 0
    num_embed_queued: int = 0
    num_steps: int = 0
    num_kv_tokens: int = 0
    num_prefill_tokens_waiting: int = 0  # input of open sessions not yet in the KV
    prompt_token_s: float | None = None  # one prompt token's prefill time, as measured (None: not yet)
    turn_tokens_left: tuple[int, ...] = ()  # per sample generating on a slot, tokens it may still generate, ascending
    step_s: float = 0.0  # a step's duration, moving average
    adapter_sessions: tuple[tuple[str, int, int], ...] = ()  # (LoRA adapter, sessions running, waiting) per loaded one
