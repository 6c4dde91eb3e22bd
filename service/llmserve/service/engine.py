"""The engine: model runner + batching executor, built from a ServerConfig.

The transport holds one Engine; it is the only way into llama.cpp.
"""

from __future__ import annotations

import structlog

from . import __version__
from .chat import ChatTemplate
from .config import ServerConfig
from .embedder import Embedder
from .executor import Executor
from .metrics import Metrics
from .model_files import default_model_path
from .runner import LlamaRunner, RunnerConfig
from .session_store import SessionStore, model_fingerprint
from .validation import Limits

log = structlog.get_logger("llmserve.engine")


class Engine:
    def __init__(self, config: ServerConfig, metrics: Metrics | None = None) -> None:
        model_path = config.model_path or default_model_path()
        if config.n_batch_effective != config.n_batch:
            log.info(
                "n_batch_clamped_for_embeddings",
                n_batch=config.n_batch,
                n_ubatch=config.n_ubatch,
                reason="embedding inputs must fit one ubatch",
            )
        self.config = config
        self.runner = LlamaRunner(
            RunnerConfig(
                model_path=model_path,
                n_ctx=config.n_ctx,
                n_parallel=config.n_parallel,
                n_batch=config.n_batch_effective,
                n_ubatch=config.n_ubatch,
                n_threads=config.n_threads,
                embeddings=config.embeddings,
                embedding_model_path=config.embedding_model_path,
                verbose=config.verbose,
                cache_type_k=config.cache_type_k,
                cache_type_v=config.cache_type_v,
                flash_attn=config.flash_attn,
            )
        )
        self.meta = self.runner.meta
        self.limits = Limits(
            n_vocab=self.runner.n_vocab,
            n_ctx_per_slot=config.n_ctx_per_slot,
            context_shift=config.context_shift,
        )
        self.chat_template = self._chat_template(config)
        if config.context_shift and not self.runner.can_shift:
            raise RuntimeError("--context-shift: this model's memory cannot shift positions")
        shift_keep = config.n_keep if config.context_shift else None
        self.sessions: SessionStore | None = None
        if config.session_dir is not None:
            fingerprint = model_fingerprint(model_path, self.meta, config.cache_type_k, config.cache_type_v)
            self.sessions = SessionStore(config.session_dir, config.session_dir_max_bytes, fingerprint, metrics or Metrics())
        self.executor = Executor(
            self.runner, config.n_parallel, config.n_ctx_per_slot, metrics, shift_keep, self.sessions
        )
        self.version = __version__
        self.embedder = self.runner.embedder  # None without embeddings
        self.pooling = self.embedder.pooling_name if self.embedder else "none"
        log.info(
            "model_loaded",
            model=self.meta.name,
            path=self.meta.path,
            n_ctx=config.n_ctx,
            n_ctx_per_slot=config.n_ctx_per_slot,
            n_parallel=config.n_parallel,
            n_batch=config.n_batch_effective,
            n_ubatch=config.n_ubatch,
            n_threads=config.n_threads,
            embeddings=config.embeddings,
            cache_type_k=config.cache_type_k,
            cache_type_v=config.cache_type_v,
            flash_attn=config.flash_attn,
            kv_unified=True,
            swa_full=True,
            context_shift=config.context_shift,
            n_parallel_auto=config.n_parallel_auto,
        )
        if self.embedder is not None:
            self._log_embedder(self.embedder)

    def _log_embedder(self, embedder: Embedder) -> None:
        log.info(
            "embedding_model_loaded",
            source="embedding_model" if embedder.owns_model else "generative_model",
            model=embedder.meta.name,
            path=embedder.meta.path,
            architecture=embedder.meta.architecture,
            pooling=embedder.pooling_name,
            n_embd=embedder.n_embd,
            n_ubatch=embedder.n_ubatch,
            n_batch=embedder.n_ubatch,  # the embeddings clamp, on the embedding context
            max_input_tokens=embedder.max_input_tokens,
        )

    def _chat_template(self, config: ServerConfig) -> ChatTemplate | None:
        bos = self.runner.tokenizer.piece(self.meta.bos_token_id, special=True).decode("utf-8", "replace")
        eos = self.runner.tokenizer.piece(self.meta.eos_token_id, special=True).decode("utf-8", "replace")
        if config.chat_template_file is not None:
            log.info("chat_template", source="file", path=str(config.chat_template_file))
            return ChatTemplate.from_file(config.chat_template_file, bos, eos)
        if self.meta.chat_template:
            log.info("chat_template", source="model")
            return ChatTemplate(self.meta.chat_template, bos, eos, "model")
        log.info("chat_template", source="none", detail="chat input needs --chat-template-file")
        return None

    def start(self) -> None:
        self.executor.start()

    def close(self) -> None:
        """After `executor.stop()`: finish saving sessions, free the model."""
        if self.sessions is not None:
            self.sessions.close()  # named sessions saved at the end are written out
        self.runner.close()
