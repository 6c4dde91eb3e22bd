"""The engine: the one object every surface talks to.

Built from a ServerConfig, it loads the model (model wing), starts the batching executor, and offers
everything a call needs, once for every surface: a call's sessions and their events (`call`: a `Call`,
engine/call.py), embeddings (with their size rule), tokenizing (large texts off the loop: `off_loop`),
compiling a constraint, rendering chat, loading a saved session, the limits a request keeps, the model.
It hides the executor, the runner and the session store; nothing here knows gRPC or HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import structlog

from .. import __version__
from ..config import ServerConfig
from ..domain.errors import GrammarError, PreconditionFailed
from ..domain.events import EventSink
from ..domain.load import ReplicaLoad, replica_load
from ..domain.model_meta import Limits
from ..domain.requests import EmbedInput, SessionParams
from ..domain.snapshots import ExecutorSnapshot, SavedSession
from ..metrics import Metrics
from ..model.default_model import default_model_path
from ..model.grammar_compiler import GrammarCompiler
from ..model.runner import LlamaRunner
from ..model.sampler import SAMPLER_NAMES
from ..model.tokenizer import Vocab
from .adapter_registry import AdapterInfo as AdapterInfo  # LoRA adapters as listed, for the wings
from .call import Call as Call  # a surface call's sessions and events, for the wings
from .call import SessionEnded as SessionEnded
from .call import Usage as Usage  # a call's token counts, for the wings
from .chat.chat import ChatMessage, Conversation
from .chat.stored import ConversationStore
from .chat.stored import StoredConversation as StoredConversation
from .chat.stored import continued as continued  # a turn continuing a stored conversation, for the wings
from .chat.stored import kept_turn as kept_turn
from .chat.stored import owner_of as owner_of  # stored conversations' owners, for the wings
from .chat.tool_formats import GENERIC as GENERIC  # the generic tool format, for the wings
from .chat.tool_formats import ToolFormat as ToolFormat
from .chat.tool_formats import template_tools
from .chat.tool_messages import as_generic_messages, template_messages
from .chat.tool_plan import ToolPlan as ToolPlan
from .chat.tool_plan import session_tools as session_tools
from .chat.tool_plan import with_preamble
from .chat.tools import Tool as Tool  # tool calling, for the transport wings
from .chat.tools import ToolChoice as ToolChoice
from .constraints import ConstraintCache
from .embed_inputs import embed_input, embedding_model_info
from .executor.executor import Executor
from .loop_sink import LoopSink as LoopSink  # executor thread -> event loop, for the wings
from .offload import OffloadPool
from .session_claims import SessionClaims
from .session_gate import SessionGate
from .session_handle import SessionHandle
from .session_store import SessionStore, model_fingerprint
from .startup import adapter_registry, chat_template, executor_config, log_loaded, runner_config, tool_format
from .stored_kv import StoredKV

log = structlog.get_logger("llmserve.engine")

T = TypeVar("T")
HEAVY_MAX_WAITING = 8  # heavy calls (Tokenize, Detokenize, bodies of megabytes) that may wait
HEAVY_THREADS = 2  # a large rendering or body never holds up all the others
LARGE_TEXT_CHARS = 16 * 1024  # longer texts are tokenized on the offload pool, not the event loop


class Engine:
    def __init__(self, config: ServerConfig, metrics: Metrics | None = None,
                 conversations: ConversationStore | None = None) -> None:
        model_path = config.model_path or default_model_path()
        if config.n_batch_effective != config.n_batch:
            log.info("n_batch_clamped_for_embeddings", n_batch=config.n_batch, n_ubatch=config.n_ubatch,
                     reason="embedding inputs must fit one ubatch")
        self.config = config
        self.version = __version__
        self.metrics = metrics = metrics or Metrics()  # the executor's: the wings count their turns in it too
        self._runner = runner = LlamaRunner(runner_config(config, model_path))
        self.meta, self.generates = runner.meta, runner.generates  # generates False: an embedding model
        shifts = config.context_shift.context_shift
        self.limits = Limits(n_vocab=runner.n_vocab, n_ctx_per_slot=config.n_ctx_per_slot, context_shift=shifts,
                             n_parallel=config.n_parallel, input_tokens_limit=config.max_input_tokens,
                             deterministic=config.deterministic, kv_per_slot=not config.kv_cache.kv_unified)
        self.chat_template = chat_template(config, runner.tokenizer, self.meta)
        self.tool_format = tool_format(config, self.chat_template, runner.tokenizer)  # the wings plan tools in it
        if shifts and self.generates and not runner.can_shift:
            raise RuntimeError("--context-shift: this model's memory cannot shift positions")
        self._store: SessionStore | None = None
        if config.session_dir is not None:
            fingerprint = model_fingerprint(model_path, self.meta, config.kv_cache)
            self._store = SessionStore(config.session_dir, config.session_dir_max_bytes, fingerprint, metrics,
                                       config.n_ctx_per_slot, runner.n_vocab)
        self.adapters = adapter_registry(config, runner, lambda command: self._executor.adapter_command(command))
        self._executor = Executor(runner, executor_config(config, runner.config.max_embed_seqs), metrics, self._store)
        self.adapters.resident = lambda: {name for name, _, _ in self._executor.snapshot.adapter_sessions}
        metrics.max_loras = min(config.adapters.max_loras, config.adapters.max_loras_per_batch)  # GIE: how many can run
        self.named_sessions = SessionClaims(self._store)  # one stream per session id (claim, release)
        self.stored_kv = StoredKV(self._store, config.store_kv)  # stored turns' KV, for their continuations
        self.session_gate = SessionGate(config.n_parallel, config.max_queue, metrics.sessions.set)  # both surfaces' admission
        # turns kept to be continued by id (chat/stored.py), across restarts with --session-dir
        self.conversations = conversations if conversations is not None else ConversationStore(
            directory=config.session_dir / "responses" if config.session_dir else None)
        embedder = runner.embedder  # None without embeddings
        self.embedding_model = embedding_model_info(embedder) if embedder is not None else None
        self.pooling = self.embedding_model.pooling if self.embedding_model else "none"
        self.samplers = SAMPLER_NAMES
        def compiler() -> GrammarCompiler:
            return GrammarCompiler(model_path, runner.vocab, config.grammar_timeout_s, config.grammar_max_mb << 20)

        self._constraints = ConstraintCache(compiler(), metrics, small_compiler=compiler())
        self._heavy = OffloadPool("heavy", HEAVY_THREADS, HEAVY_MAX_WAITING)
        log_loaded(config, self.meta, embedder)

    # ------------------------------------------------------------- lifecycle

    def start(self) -> None:
        self._executor.start()  # the grammar worker starts with the first constraint

    def stop(self, timeout: float | None = None) -> bool:
        """Stop the executor after its current step; open sessions fail (SHUTDOWN).
        False if it did not stop within `timeout`."""
        self._constraints.close()
        self._heavy.close()
        return self._executor.stop(timeout)

    def close(self) -> None:
        """After `stop()`: finish saving sessions, free the model."""
        if self._store is not None:
            self._store.close()  # named sessions saved at the end are written out
        self.conversations.close()  # and stored responses
        self._runner.close()

    def stalled_for(self) -> float | None:
        """Seconds the executor has gone without progress while work waits (0: healthy);
        None when its thread is dead."""
        return self._executor.stalled_for()

    @property
    def snapshot(self) -> ExecutorSnapshot:
        """Slots, queue and step counts as of the executor's last step."""
        return self._executor.snapshot

    @property
    def load(self) -> ReplicaLoad:
        """The load as of the executor's last step (ORCA reports, Prometheus)."""
        config = self.config
        return replica_load(self._executor.snapshot, config.n_parallel * config.n_ctx_per_slot, config.max_queue)

    # ------------------------------------------------------------- Generate

    def call(self, params: SessionParams, deadline: float | None = None, *, restore: SavedSession | None = None,
             prefix: SavedSession | None = None, grammar: object | None = None, add_bos: bool = True,
             tools: ToolPlan | None = None, one_turn: bool = True) -> Call:
        """A surface call: `Call.open` opens its sessions, all with `params`, on one sink
        (a session the executor ends is `SessionEnded`, from `Call.events`); `deadline` is
        time.monotonic(); `restore` resumes a saved session (`named_sessions`: a call of one
        session); `prefix`: saved KV of the start of its input (`stored_kv`), for a slot
        when none holds it; `grammar`: `compile_async`'s for `params.sampling.grammar`;
        `add_bos`: the first text starts with BOS (if the model's does); `tools`: the
        session's tools (`session_tools`: an active plan's constraint is the grammar); `one_turn`: see `Call`."""
        if not self.generates:  # the surfaces refuse it first (served_models.py): a decode here would end the process
            raise PreconditionFailed(f"the model {self.model_name!r} is an embedding model: it generates nothing", "model")
        asked = params.stopping.max_tokens  # prompt + the request's own must fit a slot; -n's default need not
        if asked is None and self.config.n_predict > 0:
            params = replace(params, stopping=replace(params.stopping, max_tokens=self.config.n_predict))
        params = replace(params, alora_invocation=self.adapters.invocation(params.adapters))
        prefix = None if params.sampling.deterministic or not params.takes_stored_kv else prefix  # whole chunks, no cache

        def opener(session_params: SessionParams, sink: EventSink) -> SessionHandle:
            return self._open_session(session_params, sink, deadline, restore, prefix, grammar, add_bos, tools, asked)

        return Call(LoopSink(asyncio.get_running_loop()), params, self.metrics, opener, one_turn)

    def _open_session(self, params: SessionParams, sink: EventSink, deadline: float | None,
                      restore: SavedSession | None, prefix: SavedSession | None, grammar: object | None,
                      add_bos: bool, tools: ToolPlan | None, asked_max_tokens: int | None) -> SessionHandle:
        if params.session_id and self._store is not None:
            self._store.begin(params.session_id)  # a reopen waits until this session is saved
        conversation = Conversation(restore.chat if restore is not None else None)
        if tools is not None and tools.active and tools.format.special_tags:  # the reply shows the tags it is read by
            params = replace(params, output=replace(params.output, include_special=True))
        key = self._executor.open_session(params, sink, deadline, restore or prefix, grammar, conversation)
        render = self._render_offloaded if self.chat_template is not None else None
        return SessionHandle(self._executor, key, conversation, self.limits, render, self.limits.max_input_tokens,
                             asked_max_tokens, add_bos and self.meta.add_bos, restore, tools, self.tool_format)

    @property
    def model_name(self) -> str:
        """The model's name to clients: `--alias`, else the model file's stem."""
        return self.config.alias or Path(self.meta.path).stem

    @property
    def session_store_fault(self) -> str | None:
        """Why --session-dir fails, while it does (None: it works, or there is none)."""
        return self._store.fault if self._store is not None else None

    async def compile_async(self, kind: str, text: str, field: str) -> tuple[str, object]:
        """A constraint ("grammar", "json_schema", "regex", "choice": a JSON list of strings,
        "json_object") as GBNF, and compiled (an opaque object for `call`): proven in the
        grammar worker within its CPU-time and memory budget, then parsed, on a thread of its
        own; kept by content, so a repeated text compiles once. GrammarError naming `field`
        (the text's fault); Overloaded (the machine's: too many compiles wait). A caller that
        leaves cancels its wait, and the compile if nobody else waits for it."""
        try:
            return await asyncio.wrap_future(self._constraints.get(kind, text))
        except GrammarError as exc:
            raise GrammarError(str(exc), field=field) from None

    def offload(self, fn: Callable[..., T], *args: Any, may_refuse: bool = True, size: int = 0) -> Future[T]:
        """Run heavy work (tokenizing or rendering megabytes) on a low-priority thread so
        that it never starves decoding; Overloaded when `HEAVY_MAX_WAITING` calls wait
        (unless not `may_refuse`: work of an admitted session waits its turn)."""
        return self._heavy.submit(fn, *args, may_refuse=may_refuse, size=size)

    def _render_offloaded(self, messages: Sequence[ChatMessage], tools: ToolPlan | None) -> Future[tuple[int, ...]]:
        """`render_chat` on the offload pool: a session's rendering waits its turn there, never refused."""
        size = sum(len(m.content) for m in messages)
        size += sum(len(t.parameters) + len(t.description) for t in tools.tools) if tools is not None else 0
        return self._heavy.submit(self.render_chat, messages, tools, may_refuse=False, size=size)

    def render_chat(self, messages: Sequence[ChatMessage], tools: ToolPlan | None = None) -> tuple[int, ...]:
        """The conversation rendered with the chat template, as tokens (the template must
        exist). In the generic tool format calls and results as plain messages, an active
        plan's preamble first; in a native one the template renders them, and the plan's
        tools. Blocking: call it off the event loop."""
        assert self.chat_template is not None
        if self.tool_format.native:
            listed = template_tools(tools.tools) if tools is not None and tools.active else None
            text = self.chat_template.render(template_messages(messages), tools=listed)
        else:
            messages = as_generic_messages(messages)
            if tools is not None and tools.active:
                messages = with_preamble(messages, tools)
            text = self.chat_template.render_plain(messages)
        return tuple(self._runner.tokenizer.tokenize(text, add_special=False, parse_special=True))

    # ---------------------------------------------------------------- Embed

    def embed_input(self, index: int, tokens: tuple[int, ...], field: str, normalize: bool = True,
                    truncate: bool = False, added_specials: bool = False) -> EmbedInput:
        """Input `index` of an embedding call, by the size rule (engine/embed_inputs.py):
        InvalidRequest naming `field` when it is too long, unless it may be `truncate`d."""
        assert self.embedding_model is not None
        return embed_input(self.embedding_model, index, tokens, field, normalize, truncate, added_specials)

    def embed(self, inputs: tuple[EmbedInput, ...], sink: EventSink) -> None:
        """Queue inputs made by `embed_input`; results go to `sink`."""
        self._executor.embed(inputs, sink)

    def drop_embeds(self, sink: EventSink) -> None:
        """The Embed call ended: its inputs that have not run yet are dropped."""
        self._executor.drop_embeds(sink)

    # --------------------------------------------------------- tokenization

    def _tokenizer(self, embedding_model: bool) -> Vocab:
        if not embedding_model:
            return self._runner.tokenizer
        if self._runner.embedder is None:
            raise PreconditionFailed("this server was started without --embeddings or --embedding-model")
        return self._runner.embedder.tokenizer

    def n_vocab(self, embedding_model: bool = False) -> int:
        return self._tokenizer(embedding_model).n_tokens

    def tokenize(self, text: str, add_special: bool, parse_special: bool, embedding_model: bool = False) -> list[int]:
        return self._tokenizer(embedding_model).tokenize(text, add_special, parse_special)

    async def tokenize_async(self, text: str, add_special: bool, parse_special: bool,
                             embedding_model: bool = False) -> tuple[int, ...]:
        """`tokenize` for a surface on the event loop (a session's input: waits its turn, never refused)."""
        return tuple(await self.off_loop(len(text), self.tokenize, text, add_special, parse_special, embedding_model,
                                         may_refuse=False))

    async def off_loop(self, size: int, fn: Callable[..., T], *args: Any, may_refuse: bool = True,
                       large: int = LARGE_TEXT_CHARS) -> T:
        """`fn(*args)` for a surface on the event loop, the one rule for work that grows with
        a request: over `large` (`size` in characters of text, by default) it runs on the
        offload pool (llama_tokenize releases the GIL; Overloaded when too many wait, unless
        not `may_refuse`), a small one at once."""
        if size <= large:
            return fn(*args)
        return await asyncio.wrap_future(self._heavy.submit(fn, *args, may_refuse=may_refuse, size=size))

    async def load_adapter(self, name: str, path: str, scale: float | None) -> AdapterInfo:
        """A LoRA adapter file under --adapter-dir, checked off the loop, loaded by the executor."""
        return await self.adapters.load(name, path, scale, lambda fn, *args: self.off_loop(1, fn, *args, large=0))

    def pieces(self, ids: Sequence[int], embedding_model: bool = False) -> list[bytes]:
        tokenizer = self._tokenizer(embedding_model)
        return [tokenizer.piece(t, special=True) for t in ids]

    def detokenize(self, ids: Sequence[int], render_special: bool, embedding_model: bool = False) -> str:
        """`ids` must be inside the vocabulary (checked by the caller)."""
        return self._tokenizer(embedding_model).detokenize(list(ids), render_special)
