"""Drafting and verifying speculative tokens for one sample (see speculation.py).

`propose` fills `Sample.draft` before a step (`SessionTable.propose_drafts`);
`demand` reads it; after the step `verify` samples the
decode row and each granted draft row in order with the sample's sampler, through the
same `TokenPicker` as any token (stop rules, logprobs, grammar), keeps the draft
tokens the sampler picks, stops at the first it does not, and cuts the rejected
rows from the KV before anything else can release the slot.
"""

from __future__ import annotations

from ...config import SpeculationSettings
from ...metrics import Metrics
from ..runner_api import Runner
from . import alora
from .generation_step import ReadyRow
from .sample import Sample
from .scheduler import SeqDemand
from .token_picker import TokenPicker
from .turn import TurnFinish


class DraftVerifier:
    def __init__(self, runner: Runner, picker: TokenPicker, settings: SpeculationSettings, metrics: Metrics) -> None:
        self.runner = runner
        self.picker = picker
        self.settings = settings  # each sample's SeqSpeculation drafts by these
        self.metrics = metrics

    def propose(self, s: Sample) -> int:
        """Set `s.draft` for the coming step; returns its length."""
        if s.speculation is None or s.next_token is None or s.slot is None or s.turn is None:
            s.set_draft([])
            return 0
        # Room: the slot must hold the decode token and every draft token, with one cell
        # to spare (a context shift never happens mid-draft); max_tokens counts them all.
        room = s.n_ctx_per_slot - len(s.slot.tokens) - 2
        max_tokens = s.params.stopping.max_tokens
        if max_tokens is not None:
            room = min(room, max_tokens - s.turn.completion_tokens - 1)
        s.set_draft(s.speculation.propose(s.slot.tokens, s.next_token, room))
        return len(s.draft)

    def demand(self, s: Sample) -> SeqDemand:
        """A generating sample's row demand, with the draft `propose` made for it. It is
        window-at-risk when long enough that its sliding window reaches back past cells a
        split draft could free (see scheduler._drafts_kept_whole)."""
        assert s.slot is not None
        num_draft = len(s.draft)
        n_swa = self.runner.meta.n_swa
        at_risk = num_draft > 0 and n_swa > 0 and len(s.slot.tokens) + 1 + num_draft >= n_swa
        spec = s.speculation
        acceptance, odds = (spec.acceptance, spec.odds.chance) if spec is not None else (0.0, 0.0)
        return SeqDemand(s.key, True, 0, num_draft, s.slot.seq_id, at_risk, acceptance, odds, alora.adapters_now(s),
                         s.canonical_chunk is not None)

    def verify(self, ready: ReadyRow) -> TurnFinish | None:
        s = ready.sample
        assert ready.row is not None and s.slot is not None and s.turn is not None
        if not ready.draft:  # proposed but not granted this step: score the proposal for free
            proposed = s.draft[0]
            finish = self.picker.pick(s, ready.logits, ready.row)
            if s.speculation is not None:
                s.speculation.record_shadow(s.next_token == proposed)
            return finish
        finish: TurnFinish | None = None
        num_accepted = 0
        for i in range(len(ready.draft) + 1):
            row = ready.row + i
            finish = self.picker.pick(s, ready.logits if i == 0 else self.runner.logits_row(row), row)
            if finish is not None or i == len(ready.draft) or s.next_token != ready.draft[i]:
                break
            s.record_decode(ready.draft[i])  # accepted: decoded in this step's row i + 1, already in the KV
            num_accepted += 1
        self.runner.seq_rm(s.slot.seq_id, len(s.slot.tokens), -1)  # the rows not kept
        s.turn.record_drafts(len(ready.draft), num_accepted)
        self.metrics.spec_draft_tokens.inc(len(ready.draft))
        self.metrics.spec_accepted_tokens.inc(num_accepted)
        if s.speculation is not None:
            s.speculation.record(len(ready.draft), num_accepted)
        return finish
