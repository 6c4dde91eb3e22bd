"""Speculative decoding with n-gram drafts (prompt-lookup decoding), per sample.

A generating sample whose last `spec_ngram_size_n` tokens (its sampled next token
included) occurred earlier in its own prompt or output proposes the tokens that
followed them as a draft. The draft rides the same `llama_decode` as every other
sample's rows (`GenerationStep`), each draft row with logits; the session table
then samples row by row with the sample's own sampler and keeps each draft token
the sampler picks, stopping at the first it does not (`SessionTable._verify`).
Sampling the row and comparing is llama.cpp's rule (common_sampler_sample_and_accept_n):
with a draft that is a fixed guess it leaves every token's distribution unchanged,
and greedy output is the non-speculative output up to the float rounding of rows
computed in a batch (a near tie can flip). Rejected rows are cut from the KV
with `llama_memory_seq_rm`.

Adaptive: a sample's draft length doubles after a fully accepted draft and drops
to what was accepted (+1, at least `MIN_PROPOSAL`) otherwise; after `max_misses` drafts in a row with
nothing accepted it rests for `rest_tokens` tokens. The scheduler grants draft rows
within a per-step budget that shrinks as more samples decode, since under batching
verify rows cost real compute. A lone stream's drafts are priced by `DraftOdds`, the
per-token chance that a draft token lands once those before it did (a new sample
starts from the same odds: what it drafts depends on its own tokens only, so a fixed seed
repeats run to run, batch shapes and their float rounding included); in busy steps, where a draft costs a ubatch of
its own, by the accepted share of its recent drafts. Pure Python.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...config import SpeculationSettings

MAX_MISSES = 3  # drafts in a row with nothing accepted before a sample rests
REST_TOKENS = 32  # tokens it then generates without drafting
START_ODDS = 0.8  # a new sample's per-token draft odds (the same for every sample)
# The shortest draft proposed after a miss: with its decode row four rows, the shortest a lone
# stream's step pays for (the runner's step costs, model/step_costs.py); shorter proposals
# were never granted, so never grew.
MIN_PROPOSAL = 3


class NgramIndex:
    """Where each n-gram of a sample's tokens ended (the latest `MAX_CANDIDATES` times;
    incremental, rebuilt when the history is cut or rewritten)."""

    MAX_CANDIDATES = 8  # occurrences of one n-gram compared by how far back they match
    MAX_MATCH = 64  # tokens compared before the n-gram, at most

    def __init__(self, size: int) -> None:
        self.size = size
        self._tokens: list[int] = []
        self._ends: dict[tuple[int, ...], list[int]] = {}  # n-gram -> indexes just past its occurrences

    def sync(self, tokens: Sequence[int]) -> None:
        n, mine = self.size, self._tokens
        if len(tokens) < len(mine) or (mine and tokens[len(mine) - 1] != mine[-1]):
            self._tokens, self._ends = [], {}
            mine = self._tokens
        for i in range(len(mine), len(tokens)):
            mine.append(tokens[i])
            if i + 1 >= n:
                ends = self._ends.setdefault(tuple(mine[i + 1 - n : i + 1]), [])
                ends.append(i + 1)
                if len(ends) > 2 * self.MAX_CANDIDATES:
                    del ends[: self.MAX_CANDIDATES]

    def draft(self, last: int, max_draft_tokens: int) -> list[int]:
        """What followed an earlier occurrence of (history tail + `last`): of the latest
        few, the one whose preceding tokens match the history furthest back (the latest
        on a tie), so a copy follows its source, not the last place a short n-gram recurred.
        Copied as LZ77 copies: past the history's end the draft goes on from `last` and
        from itself, so an occurrence close to the end still drafts a repeating pattern."""
        n, tokens = self.size, self._tokens
        if max_draft_tokens <= 0 or len(tokens) < n:
            return []
        key = (*tokens[len(tokens) - n + 1 :], last) if n > 1 else (last,)
        ends = self._ends.get(key)
        if not ends:
            return []
        start, best = ends[-1], -1
        for end in reversed(ends[-self.MAX_CANDIDATES :]):
            matched = 0  # tokens[end - n - 1 - k] against the history before the n-gram
            while (matched < self.MAX_MATCH and end - n - 1 - matched >= 0
                   and tokens[end - n - 1 - matched] == tokens[len(tokens) - n - matched]):
                matched += 1
            if matched > best:
                start, best = end, matched
        draft = tokens[start : start + max_draft_tokens]
        base = len(tokens) + 1  # the index of draft[0] in history + last + draft
        while len(draft) < max_draft_tokens:
            i = start + len(draft)
            draft.append(last if i == len(tokens) else draft[i - base])
        return draft


class DraftOdds:
    """The chance that a draft token is accepted given that the ones before it were:
    accepted tokens / (accepted tokens + drafts cut short), both counts decaying by
    `DECAY` per draft so that recent drafts weigh most. (The accepted *share* of a draft
    undercounts it: 3 of 16 accepted is a share of 0.19 but one miss in 4 tries, 0.75.)"""

    DECAY = 0.8

    def __init__(self, num_accepted: float = 1.0, num_missed: float = 1.0) -> None:
        self.num_accepted = num_accepted
        self.num_missed = num_missed

    @property
    def chance(self) -> float:
        return self.num_accepted / (self.num_accepted + self.num_missed)

    def add(self, num_accepted: int, missed: bool) -> None:
        self.num_accepted = self.DECAY * self.num_accepted + num_accepted
        self.num_missed = self.DECAY * self.num_missed + float(missed)


class SeqSpeculation:
    """One sample's drafting state. Nothing in it comes from other samples: an earlier
    call's drafts would change this one's batch shapes, and with them its float rounding."""

    def __init__(self, settings: SpeculationSettings, max_misses: int = MAX_MISSES, rest_tokens: int = REST_TOKENS) -> None:
        self.settings = settings
        self.max_misses = max_misses
        self.rest_tokens = rest_tokens
        self.index = NgramIndex(settings.spec_ngram_size_n)
        self.max_len = settings.draft_max
        self.misses = 0
        self.rest = 0
        # Per-token: what a lone stream's drafts are priced by. The start weighs one draft:
        # a first draft of a few rows, long ones after it lands, none after it misses.
        self.odds = DraftOdds(START_ODDS, 1.0 - START_ODDS)
        # Moving average of the accepted share of its drafts (for a draft proposed but not
        # granted, whether its first token was what the sampler picked), neutral start: what
        # drafts are priced by when they cost a ubatch of their own (busy steps).
        self.acceptance = 0.5

    def propose(self, history: Sequence[int], last: int, room: int) -> list[int]:
        """A draft after `history` + `last`, at most `room` tokens (context, max_tokens)."""
        if self.rest > 0:
            self.rest -= 1
            return []
        self.index.sync(history)
        draft = self.index.draft(last, min(self.max_len, room))
        return draft if len(draft) >= max(self.settings.draft_min, 1) else []

    def record_shadow(self, hit: bool) -> None:
        """A draft proposed but not verified: did its first token match the sampled one?"""
        self.acceptance = 0.8 * self.acceptance + 0.2 * float(hit)
        self.odds.add(int(hit), not hit)

    def record(self, num_drafted: int, num_accepted: int) -> None:
        draft_max = self.settings.draft_max
        if num_drafted:
            self.acceptance = 0.7 * self.acceptance + 0.3 * num_accepted / num_drafted
            self.odds.add(num_accepted, num_accepted < num_drafted)
        if num_accepted == num_drafted:
            self.max_len = min(self.max_len * 2, draft_max)
        else:
            self.max_len = max(num_accepted + 1, MIN_PROPOSAL)
        self.misses = self.misses + 1 if num_accepted == 0 else 0
        if self.misses >= self.max_misses:
            self.misses, self.rest, self.max_len = 0, self.rest_tokens, draft_max
