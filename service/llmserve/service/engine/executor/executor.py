"""The batching executor: one thread owns the llama context and runs every step.

The engine calls the thread-safe methods (`open_session`, `add_input`, `cancel`, `close`,
`embed`, `drop_embeds`); each only puts a command on a queue, which the thread drains once
per step (a cancel frees the slot before the next decode). `step()` reads top to bottom,
one line per phase. Events go to each request's sink, which never blocks this thread.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass

import structlog

from ...config import ContextShiftSettings, KVCacheSettings, PrefillSettings, SpeculationSettings
from ...domain.errors import FailureKind
from ...domain.events import EventSink, SessionFailed
from ...domain.requests import EmbedInput, SessionParams
from ...domain.snapshots import ExecutorSnapshot, SavedSession, SlotSnapshot
from ...faults import injected_fault
from ...metrics import Metrics
from ..chat.chat import Conversation
from ..commands import STOP, AddInput, Cancel, Close, DropEmbeds, Embed, LoadAdapter, Open, UnloadAdapter
from ..runner_api import Runner
from ..session_store import SessionStore
from .adapter_residency import AdapterResidency
from .allocator import SlotAllocator, min_scattered_reuse
from .canonical_chunks import canonical_chunk
from .draft_verifier import DraftVerifier
from .embedding_step import run_embeddings
from .generation_step import GenerationStep, StepOutput, StepProfile
from .scheduler import PlannerState, PrefillPacer, Scheduler, StepPlan
from .session_table import SessionTable
from .slot_kv import SlotKV
from .step_rotation import StepRotation
from .token_picker import TokenPicker

log = structlog.get_logger("llmserve.executor")
DRAFT_FREE_STEPS = 10  # no drafts this close to a call's deadline: a lone stream's drafts double, their steps with them


class InjectedFault(BaseException):
    """Test only: `LLMSERVE_INJECT_FAULT=die:<request_id>` kills the thread (faults.py; `stall:` blocks it)."""


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
    max_loras_per_batch: int = 4  # adapter sets running at once (admission.py)


class Executor:
    def __init__(
        self, runner: Runner, config: ExecutorConfig, metrics: Metrics | None = None, store: SessionStore | None = None
    ) -> None:
        """`store`: where named sessions are saved when they end."""
        self.metrics, self.runner, self.config = metrics or Metrics(), runner, config
        self.profile = StepProfile()
        self._keys = itertools.count(1)
        per_slot_streams = not config.kv_cache.kv_unified
        scattered = min_scattered_reuse(runner.costs, config.n_ctx_per_slot) if per_slot_streams else None
        allocator = SlotAllocator(config.n_parallel, config.n_ctx_per_slot, min_scattered_reuse=scattered,
                                  canonical_chunk=canonical_chunk(config.n_batch, config.n_ubatch))
        kv = SlotKV(runner, allocator)
        picker = TokenPicker(runner, kv, self.metrics, config.context_shift.shift_keep)
        spec = config.speculation
        verifier = DraftVerifier(runner, picker, spec, self.metrics) if spec.enabled else None
        residency = AdapterResidency(runner, config.lora_names, config.max_loras)
        self.table = SessionTable(runner, allocator, kv, picker, self._keys, store, verifier, residency,
                                  max_sets=config.max_loras_per_batch)
        self.generation = GenerationStep(runner, kv, order_by_seq_id=per_slot_streams, n_ubatch=config.n_ubatch)
        max_draft_rows = spec.spec_max_rows if spec.enabled else 0
        fixed_budget = config.prefill.prefill_budget or None  # 0: paced, a budget per step from the PrefillPacer
        self.scheduler = Scheduler(config.n_batch, config.n_ubatch, config.max_embed_seqs, fixed_budget, max_draft_rows,
                                   per_slot_streams, runner.costs)
        self.planner = PlannerState()  # what the last plan left for the next (step() keeps it)
        self.rotation = StepRotation()  # which group of sessions has the steps (step() records each)
        self.pacer = PrefillPacer(None if (ms := config.prefill.max_itl_ms) is None else ms / 1000) if fixed_budget is None else None
        self._commands: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._embeds: deque[tuple[EmbedInput, EventSink]] = deque()
        self._num_steps = 0
        self._step_s = 0.02  # moving average of a step's duration
        self.snapshot = ExecutorSnapshot()
        self._beat = time.monotonic()  # the loop's last iteration
        self._idle = True  # waiting for a command, with nothing to do
        self._fault = injected_fault()  # test only (faults.py)
        self._thread = threading.Thread(target=self._run, name="llmserve-executor", daemon=True)

    # ------------------------------------------------ thread-safe API (engine)

    def start(self) -> None:
        self._publish()
        self._thread.start()

    def stop(self, timeout: float | None = None) -> bool:
        """Stop after the current step; open sessions fail (SHUTDOWN). False: not ended in `timeout`."""
        self._commands.put(STOP)
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def stalled_for(self) -> float | None:
        """Seconds since the loop last moved while it had work (0 when idle); None: the thread died."""
        if not self._thread.is_alive():
            return None
        return 0.0 if self._idle else max(time.monotonic() - self._beat, 0.0)

    def open_session(
        self, params: SessionParams, sink: EventSink, deadline: float | None = None,
        restore: SavedSession | None = None, grammar: object | None = None,
        conversation: Conversation | None = None,
    ) -> int:
        """Open a session; `deadline` (time.monotonic) ends it with DEADLINE in time to tell the client;
        `restore` resumes a saved session; `grammar` is the compiled constraint; `conversation`
        is what a named chat session is saved with."""
        key = next(self._keys)
        self._commands.put(Open(key, params, sink, deadline, restore, grammar, conversation))
        return key

    def add_input(self, key: int, tokens: tuple[int, ...], end_of_turn: bool, replace: bool = False) -> None:
        """Append input (or, with `replace`, give the whole rendered history: chat)."""
        self._commands.put(AddInput(key, tokens, end_of_turn, replace))

    def cancel(self, key: int) -> None:
        self._commands.put(Cancel(key))

    def close(self, key: int) -> None:
        self._commands.put(Close(key))

    def embed(self, inputs: tuple[EmbedInput, ...], sink: EventSink) -> None:
        self._commands.put(Embed(inputs, sink))

    def adapter_command(self, command: LoadAdapter | UnloadAdapter) -> None:
        """Load or unload a LoRA adapter, in queue order with the sessions' commands."""
        self._commands.put(command)

    def drop_embeds(self, sink: EventSink) -> None:
        """The Embed call ended (done, failed or cancelled): its queued inputs are not computed."""
        self._commands.put(DropEmbeds(sink))

    # ------------------------------------------------------------ the thread

    def _run(self) -> None:
        try:
            while self.drain(block=False):
                self._beat, self._idle = time.monotonic(), False
                try:
                    worked = self.step()
                except Exception:  # a bug: fail the sessions involved, keep serving
                    log.exception("executor_step_failed")
                    self.table.fail_busy(FailureKind.INTERNAL, "internal error in the executor")
                    worked = True
                self._publish()
                if not worked:
                    self._idle = True
                    if not self.drain(block=True, timeout=self.table.admission.idle_timeout(self._deadline_margin_s)):
                        break
        except BaseException:
            log.critical("executor_died", exc_info=True)  # the watchdog sees the dead thread
            raise
        finally:
            self._shutdown()

    def drain(self, block: bool, timeout: float | None = None) -> bool:
        """Handle queued commands (wait up to `timeout` for one if `block`); False once stopped."""
        while True:
            try:
                command = self._commands.get(block=block, timeout=timeout if block else None)
            except queue.Empty:
                return True
            if self._idle:  # woken: from now on a stuck command counts as a stall
                self._beat, self._idle = time.monotonic(), False
            block = False
            if command is STOP:
                return False
            if isinstance(command, Embed):
                self._embeds.extend((item, command.sink) for item in command.inputs)
            elif isinstance(command, DropEmbeds):
                self._embeds = deque(entry for entry in self._embeds if entry[1] is not command.sink)
            elif isinstance(command, LoadAdapter):
                self.table.adapters.load(command, (s.params for s in self.table.sessions.values()))
                self.table.kv.forget_adapter(command.name)  # KV cached under an earlier file of that name
                self._publish()  # the resident adapters, as listed
            elif isinstance(command, UnloadAdapter):
                self.table.adapters.unload(command, (s.params for s in self.table.sessions.values()))
                self._publish()
            else:
                self._handle(command)

    def _handle(self, command: object) -> None:
        if isinstance(command, Open) and command.params.request_id == self._fault[1]:
            if self._fault[0] == "die":
                raise InjectedFault(command.params.request_id)
            if self._fault[0] == "stall":
                threading.Event().wait()
        try:
            self.table.handle(command)
        except Exception:  # a bug: fail that session only
            log.exception("executor_command_failed", command=type(command).__name__)
            self.table.fail_key(getattr(command, "key", -1), FailureKind.INTERNAL, "internal error in the executor")

    def step(self) -> bool:
        """One iteration of the loop; False when there was nothing to do. Each line is a phase, its comment
        says what it changes; `demands()`, `plan` and the fill only read (the planner's state is kept here)."""
        table = self.table
        table.expire_deadlines(self._deadline_margin_s)  # sessions out of time end
        table.expire_readers(self.config.reader_timeout_s)  # and streams nobody reads
        table.adapters.free_unused(s.params for s in table.sessions.values())  # adapters being unloaded, once unused
        if table.admit():  # waiting sessions get free (or preempted) slots
            self._publish()  # slots taken before the first token streams out
        table.sample_ready()  # turns whose prompt is cached with its logits: no decode
        table.propose_drafts(time.monotonic() + DRAFT_FREE_STEPS * self._step_s)  # speculation: drafts for the generating samples
        embed_sizes = [len(item.tokens) for item, _ in itertools.islice(self._embeds, self.scheduler.max_embed_seqs)]
        turn = self.rotation.choose(table.demands())  # one adapter set's (or lone) sessions per decode
        budget = self.pacer.budget(turn.num_groups) if self.pacer is not None else None
        plan = self.scheduler.plan(turn.demands, embed_sizes, budget, self.planner, turn.others_decode)
        self.planner = plan.next_state  # embedding/generation turns, since when each prompt waits
        if plan.is_empty:
            return False
        start, output = time.perf_counter(), None  # output: a generation step's
        if plan.is_embedding:
            run_embeddings(self.runner, [self._embeds.popleft() for _ in range(plan.num_embed)], self.metrics)
        else:
            self.runner.use_adapters(turn.group[0])  # the context's LoRA adapters (llama.cpp keeps an unchanged set)
            self.generation.cut_stale_tails(plan, table.samples)  # prefilling slots' stale KV cut (or history requeued)
            self.generation.seat_by_length(plan, table.samples)  # prompts in empty slots: ids by length (fewer ubatches)
            output = self.generation.run(plan, table.samples)  # fill, decode, collect
            table.postprocess(output)  # record what entered the KV, sample, end turns
            self.rotation.record(turn.group)  # the next step goes to the next group with work
        self._account(plan, embed_sizes, start, output)
        return True

    @property
    def _deadline_margin_s(self) -> float:  # sessions whose deadline is nearer end now
        return 1.5 * self._step_s + 0.005

    def _account(self, plan: StepPlan, embed_sizes: list[int], start: float, output: StepOutput | None) -> None:
        """After a step: its time to the pacer, the deadline margin, metrics and profile."""
        elapsed = time.perf_counter() - start
        if output is None:
            kind, num_tokens = "embed", sum(embed_sizes[: plan.num_embed])
        else:
            kind, num_tokens = "generate", plan.num_tokens
            post_s = time.perf_counter() - output.t_decoded  # collect and postprocess
            self.profile.add_step(output, post_s, self.table.picker.sample_s)  # the one writer of the profile
        self._num_steps += 1
        if self.pacer is not None and not plan.is_embedding:
            num_prefill = sum(n for _, n in plan.prefill)
            self.pacer.observe(elapsed, len(plan.decode) + sum(n for _, n in plan.drafts), num_prefill)
        self._step_s = 0.9 * self._step_s + 0.1 * elapsed
        self.metrics.observe_step(kind, elapsed, num_tokens, output.num_ubatches if output else 0)

    # ------------------------------------------------------------ bookkeeping

    def _shutdown(self) -> None:
        self._idle = True
        self.table.fail_all(FailureKind.SHUTDOWN, "the server is shutting down")
        while self._embeds:
            _, sink = self._embeds.popleft()
            sink.put(SessionFailed(FailureKind.SHUTDOWN, "the server is shutting down"))
        self._publish()

    def _publish(self) -> None:
        table = self.table
        snapshot = self.snapshot = ExecutorSnapshot(
            slots=tuple(
                SlotSnapshot(slot.seq_id, slot.busy, len(slot.tokens), paused,
                             self.runner.seq_pos_min(slot.seq_id), self.runner.seq_pos_max(slot.seq_id))
                for slot, paused in table.slot_states()
            ),
            num_sessions=len(table.sessions),
            num_waiting=len(table.waiting),
            num_embed_queued=len(self._embeds),
            num_steps=self._num_steps,
            num_kv_tokens=table.allocator.num_cached_tokens,
            num_prefill_tokens_waiting=table.num_prefill_tokens_waiting(),
            prompt_token_s=self.pacer.prefill_token_s if self.pacer is not None else None,
            turn_tokens_left=table.turn_tokens_left(),
            step_s=self._step_s,
            adapter_sessions=table.adapters.counts(table.sessions.values(), table.waiting),
        )
        self.metrics.observe_snapshot(snapshot, self.config.n_parallel * self.config.n_ctx_per_slot)
