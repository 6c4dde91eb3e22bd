"""Step scheduler: decides what one `llama_decode` call contains (pure decisions).

Per generation step: one decode token for every generating sample first (so streams never
stall behind long prompts; with per-slot streams a step that finishes every waiting prompt
may leave them to the next, prompts_first.py), then draft rows for the samples that speculate
(`max_draft_rows` shared fairly while at most `MAX_DRAFTING_SEQS` samples decode, none
with more: under batching verify rows cost real compute; with 3-4 decoding, all or none
and of one length, with 2 of one length when both draft), then prompt chunks until
`n_batch` tokens: the prompt that has waited longest gets at least an equal share of the
budget (no prompt starves), the rest goes to the prompts closest to done (shortest
remaining first: a short chat turn is not queued behind a long document, and long prompts
finish one after another instead of all together at the end). While any sample decodes,
prompt chunks are capped at `prefill_budget` tokens per step so that a long prompt cannot
stall every stream (vLLM's chunked prefill), times waiting prompts / decoding samples when
the prompts outnumber them (a burst); with nothing decoding a prompt gets all of
`n_batch`. The executor may pass a budget per step (`PrefillPacer`: as many prompt tokens
as keep a step within `--max-itl-ms`). Embedding inputs run in steps of their own: several
packed into one ubatch, alternating fairly with generation steps when both wait.

The executor (tests: a fake runner) feeds it `SeqDemand`s and the queued embedding inputs' sizes;
`plan` is a pure function of them and of the `PlannerState` the last plan left (`StepPlan.next_state`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from ...domain.requests import AdapterSet
from ..runner_api import StepCosts
from .draft_pricing import best_draft_length, worth_drafting
from .prompts_first import decode_rows_wait

MAX_DRAFTING_SEQS = 4  # more samples decoding than this: no drafts (measured: verify rows then cost more than they save)
MIN_ACCEPTANCE_BUSY = 0.85  # with 3-4 decoding only drafts that nearly always land pay for their rows (measured)
MAX_PROMPTS_WHILE_DECODING = 2  # per-slot streams: prompts one step carries beside decode rows


@dataclass(frozen=True)
class SeqDemand:
    """What one session could put in this step."""

    key: int
    decode_token: bool  # a sampled token waits to be decoded
    num_prefill: int  # prompt tokens ready to prefill now
    num_draft: int = 0  # draft tokens it would verify after its decode token
    seq_id: int = -1  # its slot's sequence id
    window_at_risk: bool = False  # long enough that a split draft could cost a sliding-window cell
    draft_acceptance: float = 0.5  # the accepted share of its drafts lately (SeqSpeculation.acceptance)
    draft_odds: float = 0.5  # its per-token draft odds lately (SeqSpeculation.odds)
    adapters: AdapterSet = ()  # the LoRA adapters it decodes under: one decode runs one set (StepRotation)
    alone: bool = False  # deterministic: its rows share no decode (canonical_chunks.py, StepRotation)
    reseatable: bool = False  # its slot holds none of its history: seat_by_length may trade it (may_trade_slot)


@dataclass(frozen=True)
class PlannerState:
    """What planning keeps from one step to the next."""

    last_was_embedding: bool = False  # embedding and generation steps alternate while both wait
    num_plans: int = 0  # plans of generation steps so far
    prefill_since: Mapping[int, int] = field(default_factory=dict)  # key -> the plan its waiting prompt showed up in
    decode_held: bool = False  # the last plan left its decode rows to this one (prompts_first.py)


@dataclass(frozen=True)
class StepPlan:
    decode: tuple[int, ...] = ()
    prefill: tuple[tuple[int, int], ...] = ()  # (key, num_tokens)
    num_embed: int = 0  # how many queued embedding inputs (from the front) to run
    drafts: tuple[tuple[int, int], ...] = ()  # (key, draft rows granted) for decoding keys
    next_state: PlannerState = PlannerState()  # what the next plan starts from

    @property
    def is_empty(self) -> bool:
        return not (self.decode or self.prefill or self.num_embed)

    @property
    def is_embedding(self) -> bool:
        return self.num_embed > 0

    @property
    def num_tokens(self) -> int:
        return len(self.decode) + sum(n for _, n in self.drafts) + sum(n for _, n in self.prefill)


class Scheduler:
    def __init__(
        self, n_batch: int, n_ubatch: int, max_embed_seqs: int, prefill_budget: int | None = None,
        max_draft_rows: int = 0, per_slot_streams: bool = False, costs: StepCosts | None = None,
    ) -> None:
        """`prefill_budget`: prompt tokens per step while samples decode (None: no cap). `per_slot_streams`:
        one KV stream per slot (rows go in sequence-id order, see `_drafts_kept_whole`). `costs`: the
        runner's, which price drafts (needed with `max_draft_rows`)."""
        if max_draft_rows and costs is None:
            raise ValueError("drafts are priced by the runner's step costs")
        self.costs = costs
        self.prefill_budget = prefill_budget
        self.per_slot_streams = per_slot_streams
        self.price_drafts = True  # grant only the draft rows that pay (worth_drafting); tests of the draft mechanics turn it off
        self.max_draft_rows, self.n_batch, self.n_ubatch, self.max_embed_seqs = max_draft_rows, n_batch, n_ubatch, max_embed_seqs

    def plan(self, demands: Sequence[SeqDemand], embed_sizes: Sequence[int], prefill_budget: int | None = None,
             state: PlannerState = PlannerState(), others_decode: bool = False) -> StepPlan:
        """Plan one step (reads only). `embed_sizes` are the token counts of queued embedding
        inputs; `prefill_budget`: this step's cap on prompt tokens while others decode (the
        pacer's; None: the scheduler's own); `state`: the last plan's `next_state` (a fresh
        one for a first plan); `others_decode`: sessions not in `demands` decode too (another
        group's, StepRotation), so prompts are paced even if none of these decode."""
        wants_generation = any(d.decode_token or d.num_prefill for d in demands)
        wants_embedding = bool(embed_sizes)
        if wants_embedding and (not wants_generation or not state.last_was_embedding):
            num_embed = self._pack_embeddings(embed_sizes)
            return StepPlan(num_embed=num_embed, next_state=replace(state, last_was_embedding=True))
        state = replace(state, last_was_embedding=False)
        if not wants_generation:
            return StepPlan(next_state=state)
        return self._plan_generation(demands, self.prefill_budget if prefill_budget is None else prefill_budget,
                                     state, others_decode)

    def _pack_embeddings(self, sizes: Sequence[int]) -> int:
        used = count = 0
        for size in sizes:
            if count == self.max_embed_seqs or used + size > self.n_ubatch:
                break
            used += size
            count += 1
        return max(count, 1)  # inputs are validated to fit one ubatch

    def _plan_generation(self, demands: Sequence[SeqDemand], prefill_budget: int | None,
                         state: PlannerState, others_decode: bool) -> StepPlan:
        decode = tuple(d.key for d in demands if d.decode_token)
        drafts = self._grant_drafts([d for d in demands if d.decode_token and d.num_draft > 0], len(decode))
        if self.per_slot_streams:
            drafts = _drafts_kept_whole(drafts, demands)
        budget = self.n_batch - len(decode) - sum(n for _, n in drafts)
        waiting = [d for d in demands if d.num_prefill > 0]
        paced = (bool(decode) or others_decode) and prefill_budget is not None
        outnumbered = paced and len(waiting) > len(decode)
        if paced:
            # A waiting prompt's share of a step is never less than a decoding stream's: when prompts outnumber
            # the decoding samples (a burst) the cap grows with the ratio, else one stream holds a dozen back.
            scale = max(1.0, len(waiting) / len(decode)) if decode else 1.0
            budget = min(budget, int(prefill_budget * scale))  # type: ignore[operator]
        # Per-slot streams: each chunk past the decode rows' ubatch is a ubatch: at most two (a burst: all).
        max_prompts = MAX_PROMPTS_WHILE_DECODING if paced and not outnumbered and self.per_slot_streams else None
        num_plans = state.num_plans + 1
        since = {d.key: state.prefill_since.get(d.key, num_plans) for d in waiting}
        prefill = _share_prefill(waiting, since, budget, max_prompts)
        held = self.per_slot_streams and self.costs is not None and not state.decode_held and decode_rows_wait(
            {d.key: (d.seq_id, d.num_prefill, d.reseatable) for d in demands}, decode, drafts, prefill, self.costs,
            self.n_ubatch)
        decode, drafts = ((), []) if held else (decode, drafts)  # prompts first: decode rows next step (prompts_first.py)
        return StepPlan(decode=decode, prefill=tuple(prefill), drafts=tuple(drafts),
                        next_state=PlannerState(state.last_was_embedding, num_plans, since, held))

    def _grant_drafts(self, wanting: list[SeqDemand], num_decoding: int) -> list[tuple[int, int]]:
        # Unified cache: decode and draft rows lead the batch and stay in its first ubatch: llama.cpp then places
        # them all against the pre-step positions, so no cell a rejected draft's sequence still needs can leave
        # the sliding window (see SlotKV.holds_window). Per-slot streams: see _drafts_kept_whole.
        costs = self.costs
        if costs is None:  # no drafts (max_draft_rows 0)
            return []
        rows = self.max_draft_rows if num_decoding <= MAX_DRAFTING_SEQS else 0
        if num_decoding > 2:
            wanting = [d for d in wanting if d.draft_acceptance >= MIN_ACCEPTANCE_BUSY]
            # All or none: drafts that speed up some streams make every step of the others slower, and a closed
            # loop's throughput waits for the slowest (plain c=4 lost 13% when only looping streams drafted).
            if len(wanting) < num_decoding:
                return []
        budget = min(rows, self.n_ubatch - num_decoding)
        one_ubatch = num_decoding != 2 or self.per_slot_streams  # unified, 2 decoding: fair shares instead
        if self.price_drafts and wanting and len(wanting) == num_decoding and one_ubatch:
            # Every decoding sample drafts (a lone stream, or all 2-4): equal lengths keep their rows in one
            # ubatch (split_equal), so no draft pays for an extra one. Up to 3 decoding the rows are priced by
            # step_cost (a multiple of four is cheap; 2: a 1-token draft each makes 4 rows, ~1.3x the step of 2);
            # with 4 any length is whole groups of four, and the linear pricing measured better there (extractive
            # c=4, 8 rounds: step_cost's shorter drafts 0.95x). A lone stream prices by per-token odds (measured
            # on medians: c=1 extractive +14%, plain +22% over the share).
            cap = budget // num_decoding
            if num_decoding % 4:
                k = min(best_draft_length(costs, d.draft_odds if num_decoding == 1 else d.draft_acceptance,
                                          min(d.num_draft, cap), num_decoding) for d in wanting)
            else:
                k = min(min(worth_drafting(costs, d.draft_acceptance, num_decoding, d.num_draft, False)
                            for d in wanting), cap)
            return [(d.key, k) for d in wanting] if k > 0 else []
        # Two decoding and one drafting (or one buffer): fair shares, priced by the accepted
        # share (odds lost extractive c=4 26%), a ubatch of their own with per-slot streams.
        extra_ubatch = self.per_slot_streams and num_decoding > 1
        wants = [(d.key, worth_drafting(costs, d.draft_acceptance, num_decoding, d.num_draft, extra_ubatch)
                  if self.price_drafts else d.num_draft) for d in wanting]
        return _fair_shares([(key, n) for key, n in wants if n > 0], budget)


def _share_prefill(waiting: list[SeqDemand], since: Mapping[int, int], budget: int,
                   max_prompts: int | None = None) -> list[tuple[int, int]]:
    """The oldest waiting prompt (`since`: the plan each showed up in) gets at least an equal
    share; the rest of the budget goes shortest-remaining first (ties: the older first), to
    `max_prompts` at most."""
    if not waiting or budget <= 0:
        return []
    oldest = min(waiting, key=lambda d: (since[d.key], d.key))
    granted = {oldest.key: min(oldest.num_prefill, max(budget // len(waiting), 1))}
    left = budget - granted[oldest.key]
    for d in sorted(waiting, key=lambda d: (d.num_prefill - granted.get(d.key, 0), since[d.key], d.key)):
        extra = min(d.num_prefill - granted.get(d.key, 0), left)
        if extra > 0 and (d.key in granted or max_prompts is None or len(granted) < max_prompts):
            granted[d.key] = granted.get(d.key, 0) + extra
            left -= extra
    return list(granted.items())


def _drafts_kept_whole(drafts: list[tuple[int, int]], demands: Sequence[SeqDemand]) -> list[tuple[int, int]]:
    """Drop the drafts whose rows could be split so that a rejected one costs a window cell.

    With one stream per slot llama.cpp puts in each ubatch a run of consecutive sequence ids
    with equal tokens each (`split_equal`). A draft whose rows land in two ubatches after
    the first one frees, in the later one, cells its sequence needs if the draft is then
    rejected. That can happen only when a neighbouring id carries more than one row (a
    prompt chunk or drafts of its own); with neighbours of one row or none, the rows go in
    one ubatch, or the decode row in one and all drafts in the next. So a sequence long
    enough for its window to matter drafts only when its neighbours carry one row at most
    (a neighbour's prompt is never held back for a draft)."""
    by_key = {d.key: d for d in demands}
    rows = {d.seq_id: 1 if d.decode_token else d.num_prefill for d in demands}
    at_risk_drafting: set[int] = set()
    kept: list[tuple[int, int]] = []
    for key, n in drafts:
        d = by_key[key]
        near = (d.seq_id - 1, d.seq_id + 1)
        if (d.window_at_risk and max(rows.get(i, 0) for i in near) > 1) or at_risk_drafting.intersection(near):
            continue
        kept.append((key, n))
        rows[d.seq_id] = 1 + n
        if d.window_at_risk:
            at_risk_drafting.add(d.seq_id)
    return kept


def _fair_shares(wants: list[tuple[int, int]], budget: int) -> list[tuple[int, int]]:
    """Split `budget` across (key, wanted) in order: equal shares, what one leaves goes to the
    next, the first in order gets the rounding."""
    shares: list[tuple[int, int]] = []
    for i, (key, wanted) in enumerate(wants):
        if budget <= 0:
            break
        left = len(wants) - i
        n = min(wanted, max(budget // left, 1) if i else max(budget - (budget // left) * (left - 1), 1))
        shares.append((key, n))
        budget -= n
    return shares


class PrefillPacer:
    """The prompt budget per step that keeps the gap a decoding stream sees within
    `max_itl_s` while prompts prefill: (max_itl - a decode-only step) / one prompt token's
    cost, from moving averages measured on this machine as it runs. Large chunks waste
    nothing (the decode rows ride along), so the budget is as large as the gap allows:
    few slow steps rather than many, which keeps the median gap at a decode step's.

    `max_itl_s` None: `AUTO_ITL_STEPS` decode-only steps. Prompts then get 9/10 of the
    machine while streams decode and the longest gap is 10 ordinary ones, on any hardware;
    a fixed bound in ms is too loose on a fast machine (where a prompt's whole prefill,
    llama-server's stall, is short) and too tight on a slow one."""

    # Measured (docs/benchmarks.md, "The prefill pacer's knob"): 8 streams beside 4 prompts
    # of ~1,400 tokens; the longest gap tracks the bound, llama-server's stall is ~45 decode
    # steps, and the last prompt's finish varied more between runs than with the bound.
    AUTO_ITL_STEPS = 10

    def __init__(self, max_itl_s: float | None = None, min_chunk_tokens: int = 32, max_chunk_tokens: int = 2048) -> None:
        self.max_itl_s = max_itl_s
        self.min_chunk_tokens = min_chunk_tokens
        self.max_chunk_tokens = max_chunk_tokens
        self.decode_step_s: float | None = None
        self.prefill_token_s: float | None = None

    def observe(self, elapsed_s: float, num_decode_rows: int, num_prefill_tokens: int) -> None:
        if num_decode_rows and not num_prefill_tokens:
            self.decode_step_s = _ema(self.decode_step_s, elapsed_s)
        elif num_prefill_tokens >= 8:
            base = (self.decode_step_s or 0.0) if num_decode_rows else 0.0
            cost = max(elapsed_s - base, 0.0) / num_prefill_tokens
            # A prompt token costs more the further into its prompt (attention), so the
            # latest cost counts in full when it is the higher: the bound holds as it rises.
            self.prefill_token_s = max(_ema(self.prefill_token_s, cost), cost)

    def budget(self, num_groups: int = 1) -> int:
        """Prompt tokens for the next step; `num_groups` groups taking turns (StepRotation)
        share the gap, so each step gets its share of it."""
        if self.decode_step_s is None or not self.prefill_token_s:
            return self.min_chunk_tokens
        max_itl_s = self.max_itl_s if self.max_itl_s is not None else self.AUTO_ITL_STEPS * self.decode_step_s
        tokens = int((max_itl_s / num_groups - self.decode_step_s) / self.prefill_token_s)
        return max(self.min_chunk_tokens, min(tokens, self.max_chunk_tokens))


def _ema(current: float | None, value: float, weight: float = 0.2) -> float:
    return value if current is None else (1 - weight) * current + weight * value
