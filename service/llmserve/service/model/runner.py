"""The llama.cpp runner: every ctypes call on the model and contexts lives here.

Owns the model, the generation llama_context (one KV stream per slot unless
`kv_unified`), the numpy-backed batch, with embeddings on an `Embedder` (a context of
its own: on the generative model, stopping before the LM head, or on a separate
`--embedding-model`), and the cost model of its steps (`step_costs.py`). Apart from the
tokenizers (vocab.py), which only read immutable vocabularies, it is used by the executor
thread alone.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import llama_cpp
import numpy as np
import structlog

from ..config import CACHE_TYPES, FLASH_ATTN
from ..domain.errors import GrammarError
from ..domain.requests import AdapterSet, SamplingParams
from .adapters import AdapterFile, Adapters, check_adapter_file
from .batch import BatchBuffer
from .cpu_check import check_cpu_kernels
from .embedder import Embedder
from .grammar_compiler import CompiledGrammar
from .runner_config import RunnerConfig
from .sampler import Sampler
from .step_costs import LLAMA_CPU_COSTS, LlamaCpuCosts, MeasuredCosts
from .step_timing import load_or_measure
from .tokenizer import Vocab, load_model

# ggml.h enum ggml_log_level
_GGML_LEVELS = {1: "debug", 2: "info", 3: "warning", 4: "error"}
_GGML_LOG_CONT = 5
_llama_log_state: dict[str, object] = {"verbose": False, "level": 2, "buffer": ""}
_llama_logger = structlog.get_logger("llama.cpp")


@llama_cpp.llama_log_callback
def _llama_log(level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
    """llama.cpp's log, line by line, through structlog: warnings and errors by
    default, everything with --verbose."""
    state = _llama_log_state
    if level != _GGML_LOG_CONT:
        state["level"] = level
    state["buffer"] = str(state["buffer"]) + text.decode("utf-8", "replace")
    if not str(state["buffer"]).endswith("\n"):
        return
    message, state["buffer"] = str(state["buffer"]).strip(), ""
    name = _GGML_LEVELS.get(int(state["level"]), "info")  # type: ignore[call-overload]
    if message and (state["verbose"] or name in ("warning", "error")):
        getattr(_llama_logger, name)("llama_cpp", message=message)


class LlamaRunner:
    def __init__(self, config: RunnerConfig) -> None:
        _llama_log_state["verbose"] = config.verbose
        llama_cpp.llama_log_set(_llama_log, ctypes.c_void_p(0))
        self.config = config
        check_cpu_kernels(Path(config.model_path))  # a build whose kernels die here stops now, saying why
        self.model = load_model(config.model_path)
        self.tokenizer = Vocab(self.model)
        self.vocab = self.tokenizer.ptr  # the raw llama_vocab, for samplers and grammars
        self.n_vocab = self.tokenizer.n_tokens
        self.meta = self.tokenizer.read_meta(Path(config.model_path))
        self.generates = not self.tokenizer.pools(self.meta)  # an embedding model (BERT, ...): embeddings only
        if not self.generates:
            self._embeddings_only()
            return
        self.ctx = llama_cpp.llama_init_from_model(self.model, self._context_params())
        if not self.ctx:
            llama_cpp.llama_model_free(self.model)
            kv = config.kv_cache
            raise RuntimeError(
                f"llama.cpp could not create the context (cache types K={kv.cache_type_k} "
                f"V={kv.cache_type_v}, flash attention {kv.flash_attn}); see its log above"
            )
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        self.batch = BatchBuffer(config.n_batch)
        # what a step costs (runner_api.StepCosts) on this machine: timed here once, then cached
        self.costs: LlamaCpuCosts | MeasuredCosts = (
            LLAMA_CPU_COSTS if config.step_costs == "builtin" else load_or_measure(self, config))
        self.adapters = Adapters(self.model, self.ctx, self.meta.architecture)
        for spec in config.lora:  # one that cannot load stops the start (AdapterFileError)
            self.adapters.load(spec.name, check_adapter_file(spec.path, self.meta.architecture))
        self.embedder = self._embedder() if config.embeddings else None

    def _embeddings_only(self) -> None:
        """An embedding model (its GGUF declares a pooling): an Embedder on it and no generation
        context; the KV and decode methods are never called (served_models.py refuses
        generation for it) and the queries the executor's bookkeeping makes answer empty."""
        c = self.config
        self.ctx = self.memory = None
        self.batch = BatchBuffer(1)
        self.costs = LLAMA_CPU_COSTS  # no generation step to price
        self.adapters = Adapters(self.model, None, self.meta.architecture)
        self.embedder = Embedder(self.tokenizer, self.meta, c.n_ubatch, c.max_embed_seqs, c.n_threads)

    def _embedder(self) -> Embedder:
        c = self.config
        if c.embedding_model_path is not None:
            return Embedder.from_file(c.embedding_model_path, c.n_ubatch, c.max_embed_seqs, c.n_threads)
        return Embedder(self.tokenizer, self.meta, c.n_ubatch, c.max_embed_seqs, c.n_threads)

    def _context_params(self) -> llama_cpp.llama_context_params:
        c, kv = self.config, self.config.kv_cache
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = c.n_ctx
        params.n_batch = c.n_batch
        params.n_ubatch = c.n_ubatch
        params.n_seq_max = c.n_parallel
        params.n_threads = c.n_threads
        params.n_threads_batch = c.n_threads
        params.embeddings = False  # embeddings run on the Embedder's own context
        # One stream per slot: a ubatch attends only to its own sequence's cells. A unified
        # cache makes every ubatch span the cells of every slot's cached prefix (masked), so
        # prefill slowed as the prefix caches filled. Per-slot streams split batches into
        # ubatches of consecutive sequence ids (the step orders its rows by sequence id).
        params.kv_unified = kv.kv_unified
        # Without a full-size SWA cache, cells that left a sequence's window are reused
        # sooner; SlotKV.holds_window catches a trimmed prefix that lost some.
        params.swa_full = kv.swa_full
        params.no_perf = True
        params.type_k = CACHE_TYPES[kv.cache_type_k]
        params.type_v = CACHE_TYPES[kv.cache_type_v]
        params.flash_attn_type = FLASH_ATTN[kv.flash_attn]
        return params

    # ------------------------------------------------------------- decoding

    def piece(self, token: int, special: bool = False) -> bytes:
        return self.tokenizer.piece(token, special)

    def new_sampler(
        self, params: SamplingParams, n_ctx: int, banned_tokens: tuple[int, ...] = (), grammar: object | None = None
    ) -> Sampler:
        """A sampler chain for one sequence, reading this context's logits rows; `grammar`
        is `params.grammar` compiled by the GrammarCompiler."""
        assert grammar is None or isinstance(grammar, CompiledGrammar)
        if params.grammar and grammar is None:
            raise GrammarError("the grammar was not compiled")
        return Sampler(params, self.vocab, self.n_vocab, n_ctx, banned_tokens, self.ctx, grammar)

    def decode(self) -> int:
        """Run the batch as filled; 0 on success (llama_decode's status otherwise)."""
        return int(llama_cpp.llama_decode(self.ctx, self.batch.finish()))

    def use_adapters(self, adapters: AdapterSet) -> None:
        """The LoRA adapters the next decodes run under (llama_set_adapters_lora)."""
        self.adapters.use(adapters)

    def load_adapter(self, name: str, checked: object) -> AdapterFile:
        """`checked`: the file's AdapterFile (model.adapters.check_adapter_file, done off this thread)."""
        assert isinstance(checked, AdapterFile)
        return self.adapters.load(name, checked)

    def unload_adapter(self, name: str) -> AdapterFile:
        return self.adapters.unload(name)

    def logits_row(self, row: int) -> np.ndarray:
        """A view (no copy) of the logits of batch row `row` from the last decode."""
        ptr = llama_cpp.llama_get_logits_ith(self.ctx, row)
        if not ptr:
            raise RuntimeError(f"no logits for batch row {row}")
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))

    def seq_shift(self, seq_id: int, keep: int, discard: int) -> None:
        """Context shift: drop positions [keep, keep+discard) and move the rest down
        (llama.cpp applies the RoPE change lazily on the next decode)."""
        llama_cpp.llama_memory_seq_rm(self.memory, seq_id, keep, keep + discard)
        llama_cpp.llama_memory_seq_add(self.memory, seq_id, keep + discard, -1, -discard)

    @property
    def can_shift(self) -> bool:
        return self.memory is not None and bool(llama_cpp.llama_memory_can_shift(self.memory))

    def seq_state(self, seq_id: int) -> bytes:
        """The sequence's KV state (llama_state_seq_get_data)."""
        size = llama_cpp.llama_state_seq_get_size(self.ctx, seq_id)
        buf = (ctypes.c_uint8 * size)()
        written = llama_cpp.llama_state_seq_get_data(self.ctx, buf, size, seq_id)
        return ctypes.string_at(buf, written)  # bytes(buf[:n]) builds a list: 0.9 s per 20 MB

    def set_seq_state(self, seq_id: int, data: bytes) -> bool:
        """Load a saved state into `seq_id`; False when llama.cpp refuses it."""
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        return bool(llama_cpp.llama_state_seq_set_data(self.ctx, buf, len(data), seq_id))

    def seq_cp(self, src: int, dst: int) -> None:
        llama_cpp.llama_memory_seq_cp(self.memory, src, dst, -1, -1)

    def embed(self, inputs: list[tuple[int, ...]]) -> list[np.ndarray]:
        """Pooled embeddings of inputs packed into one ubatch (see embedder.py)."""
        if self.embedder is None:
            raise RuntimeError("embeddings are not enabled")
        return self.embedder.embed(inputs)

    # ------------------------------------------------------------- KV memory

    def seq_rm(self, seq_id: int, p0: int, p1: int = -1) -> bool:
        return bool(llama_cpp.llama_memory_seq_rm(self.memory, seq_id, p0, p1))

    def seq_pos_min(self, seq_id: int) -> int:
        return int(llama_cpp.llama_memory_seq_pos_min(self.memory, seq_id)) if self.memory is not None else -1

    def seq_pos_max(self, seq_id: int) -> int:
        return int(llama_cpp.llama_memory_seq_pos_max(self.memory, seq_id)) if self.memory is not None else -1

    def close(self) -> None:
        if self.embedder is not None:
            self.embedder.close()
        if self.ctx:
            self.adapters.close()
            llama_cpp.llama_free(self.ctx)
            self.ctx = None
        self.embedder = None
        if self.model:
            llama_cpp.llama_model_free(self.model)
            self.model = None
            _trim_heap()


def _trim_heap() -> None:
    """Give the pages a freed model leaves in glibc's heap back to the system: without it a
    server that loads and unloads models (--models-max) grew about 1 MiB a swap, measured."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim
        pass
