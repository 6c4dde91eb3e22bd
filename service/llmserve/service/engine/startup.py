"""What the engine derives from the configuration and the loaded model: the runner's and
the executor's configurations, the chat template and tool format, the adapters, and the
start-up log lines."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from ..config import ServerConfig
from ..domain.model_meta import ModelMeta
from ..model.runner_config import RunnerConfig
from .adapter_registry import AdapterRegistry
from .chat.chat import PACKAGED_TEMPLATES, ChatTemplate
from .chat.tool_formats import ToolFormat, choose
from .executor.executor import ExecutorConfig

if TYPE_CHECKING:  # the model wing's classes, for type hints only
    from ..model.embedder import Embedder
    from ..model.runner import LlamaRunner
    from ..model.tokenizer import Vocab

log = structlog.get_logger("llmserve.engine")


def runner_config(config: ServerConfig, model_path: Path) -> RunnerConfig:
    return RunnerConfig(
        model_path=model_path,
        n_ctx=config.n_ctx,
        n_parallel=config.n_parallel,
        n_batch=config.n_batch_effective,
        n_ubatch=config.n_ubatch,
        n_threads=config.n_threads,
        embeddings=config.embeddings,
        embedding_model_path=config.embedding_model_path,
        verbose=config.verbose,
        kv_cache=config.kv_cache,
        step_costs=config.step_costs,
        lora=config.adapters.lora,
    )


def executor_config(config: ServerConfig, max_embed_seqs: int) -> ExecutorConfig:
    return ExecutorConfig(
        n_parallel=config.n_parallel,
        n_ctx_per_slot=config.n_ctx_per_slot,
        n_batch=config.n_batch_effective,
        n_ubatch=config.n_ubatch,
        max_embed_seqs=max_embed_seqs,
        reader_timeout_s=config.reader_timeout_s or None,
        prefill=config.prefill,
        speculation=config.speculation,
        kv_cache=config.kv_cache,
        context_shift=config.context_shift,
        lora_names=tuple(spec.name for spec in config.adapters.lora),
        max_loras=config.adapters.max_loras,
        max_loras_per_batch=config.adapters.max_loras_per_batch,
    )


def chat_template(config: ServerConfig, tokenizer: Vocab, meta: ModelMeta) -> ChatTemplate | None:
    """`--chat-template-file`, else the GGUF's `tokenizer.chat_template`, else the one the
    package ships for the model's architecture (PACKAGED_TEMPLATES), else none."""
    bos = tokenizer.piece(meta.bos_token_id, special=True).decode("utf-8", "replace")
    eos = tokenizer.piece(meta.eos_token_id, special=True).decode("utf-8", "replace")
    if config.chat_template_file is not None:
        log.info("chat_template", source="file", path=str(config.chat_template_file))
        return ChatTemplate.from_file(config.chat_template_file, bos, eos)
    if meta.chat_template:
        log.info("chat_template", source="model")
        return ChatTemplate(meta.chat_template, bos, eos, "model")
    packaged = PACKAGED_TEMPLATES.get(meta.architecture)
    if packaged is not None:
        log.info("chat_template", source="packaged", path=str(packaged), architecture=meta.architecture)
        return ChatTemplate.from_file(packaged, bos, eos, "packaged")
    log.info("chat_template", source="none", detail="chat input needs --chat-template-file")
    return None


def tool_format(config: ServerConfig, template: ChatTemplate | None, tokenizer: Vocab) -> ToolFormat:
    """`--tool-format` (auto: the chat template's), knowing whether its opening tag is one
    token of the vocabulary (then replies that may answer are held from it on: a lazy grammar)."""
    chosen = choose(config.tool_format, template.source if template is not None else None)
    if chosen.native:
        opening = tokenizer.tokenize(chosen.opening, add_special=False, parse_special=True)
        chosen = replace(chosen, opening_is_token=len(opening) == 1)
    log.info("tool_format", name=chosen.name, asked=config.tool_format, auto_held=chosen.opening_is_token)
    return chosen


def log_loaded(config: ServerConfig, meta: ModelMeta, embedder: Embedder | None) -> None:
    log.info(
        "model_loaded",
        model=meta.name,
        path=meta.path,
        n_ctx=config.n_ctx,
        n_ctx_per_slot=config.n_ctx_per_slot,
        n_parallel=config.n_parallel,
        n_batch=config.n_batch_effective,
        n_ubatch=config.n_ubatch,
        n_threads=config.n_threads,
        embeddings=config.embeddings,
        cache_type_k=config.kv_cache.cache_type_k,
        cache_type_v=config.kv_cache.cache_type_v,
        flash_attn=config.kv_cache.flash_attn,
        kv_unified=config.kv_cache.kv_unified,
        swa_full=config.kv_cache.swa_full,
        context_shift=config.context_shift.context_shift,
        n_parallel_auto=config.n_parallel_auto,
    )
    if embedder is not None:
        log.info(
            "embedding_model_loaded",
            source="embedding_model" if embedder.owns_model else "this_model" if embedder.pools_in_llama else "generative_model",
            model=embedder.meta.name,
            path=embedder.meta.path,
            architecture=embedder.meta.architecture,
            pooling=embedder.pooling_name,
            n_embd=embedder.n_embd,
            n_ubatch=embedder.n_ubatch,
            n_batch=embedder.n_ubatch,  # the embeddings clamp, on the embedding context
            max_input_tokens=embedder.max_input_tokens,
        )


def adapter_registry(config: ServerConfig, runner: LlamaRunner, submit: Callable[[object], None]) -> AdapterRegistry:
    """The adapters loaded at start (the runner loaded them), as requests see them. Made
    before the Executor, which unloads the `--lora` beyond `--max-loras` (adapter_residency.py)."""
    settings = config.adapters
    registry = AdapterRegistry(runner.meta.architecture, settings.max_loras, settings.adapter_dir,
                               settings.allow_adapter_updates, submit)
    for spec in settings.lora:
        _, checked = runner.adapters.loaded[spec.name]
        registry.add(spec.name, spec.path, spec.scale, checked)
    return registry
