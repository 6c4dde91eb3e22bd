"""A deterministic stand-in for the llama.cpp runner (no llama_cpp, no model).

It implements `llmserve.service.engine.runner_api.Runner`. The "model" continues any
sequence with the next token id (`last + 1`), except that `END_AFTER` is followed
by the EOG token, so a prompt ending in 10 generates 11, 12, ..., END_AFTER, EOG.
The second choice (a lower logit) is `last + 2`, so a ban or bias changes the pick.
Every decode checks that each row extends its sequence's KV at the next position:
the fake's KV is the ground truth the engine's slot mirror is compared against.
With `n_swa`, the fake splits each batch into ubatches as llama.cpp does (`split_equal`
with one KV stream per slot, chunks of `n_ubatch` with a unified buffer) and, before
placing each ubatch, drops every cell that has left the window of its sequence's next
position (what llama.cpp's find_slot may reuse), then checks that every row still has
the window it attends to. Its cost model (`FakeCosts`) prices a step as llama.cpp's CPU
kernels do, so the scheduler grants drafts as it would for the real runner, and counts
ubatches by the fake's own split.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
from llmserve.service.domain.model_meta import ModelMeta
from llmserve.service.domain.requests import AdapterSet, SamplingParams
from llmserve.service.model.batch_arrays import BatchArrays
from llmserve.service.model.step_costs import LLAMA_CPU_COSTS

N_VOCAB = 64
EOG = 1
BOS = 2
END_AFTER = 40

META = ModelMeta(
    name="fake", path="fake.gguf", architecture="fake", num_parameters=0, n_ctx_train=4096, n_embd=4,
    vocab_size=N_VOCAB, bos_token_id=BOS, eos_token_id=EOG, eog_token_ids=(EOG,), add_bos=True, chat_template=None,
)


def piece_of(token: int) -> bytes:
    """Special tokens render as nothing; the rest as one letter each (a..z, cycling)."""
    return b"" if token < 3 else bytes([ord("a") + token % 26])


def next_token(last: int) -> int:
    return EOG if last == END_AFTER else (last + 1) % N_VOCAB


def split_equal(rows: list[tuple[int, int]], n_ubatch: int) -> list[list[int]]:
    """llama_batch_allocr::split_equal(n_ubatch, sequential=true) over (seq_id, pos) rows,
    as lists of row indices: each ubatch takes, from the first unused row on, sequences
    whose ids follow one another (in batch order) and the same number of rows of each."""
    used = [False] * len(rows)
    ubatches: list[list[int]] = []
    while not all(used):
        run: list[int] = []
        for i, (seq, _) in enumerate(rows):
            if not used[i] and seq not in run and (not run or seq == run[-1] + 1):
                run.append(seq)
        todo = {seq: [i for i, (s, _) in enumerate(rows) if s == seq and not used[i]] for seq in run}
        ubatch: list[int] = []
        depth = 0
        while all(depth < len(todo[seq]) for seq in run):
            ubatch += [todo[seq][depth] for seq in run]
            depth += 1
            if (depth + 1) * len(run) > n_ubatch:
                break
        for i in ubatch:
            used[i] = True
        ubatches.append(ubatch)
    return ubatches


class FakeCosts:
    """`runner_api.StepCosts` of the fake: llama.cpp's CPU step costs (model/step_costs.py),
    and as many ubatches as the fake's decode makes of a batch."""

    base_rows = LLAMA_CPU_COSTS.base_rows

    def step_cost(self, num_rows: int) -> float:
        return LLAMA_CPU_COSTS.step_cost(num_rows)

    def prefill_cost(self, num_tokens: int) -> float:
        return LLAMA_CPU_COSTS.prefill_cost(num_tokens)

    def num_ubatches(self, rows: Sequence[tuple[int, int]], n_ubatch: int, per_slot_streams: bool) -> int:
        if not per_slot_streams:
            return -(-sum(n for _, n in rows) // n_ubatch)
        return len(split_equal([(seq, pos) for seq, n in rows for pos in range(n)], n_ubatch))


class FakeBatch(BatchArrays):
    """The real runner's fill (model/batch_arrays.py) without the llama_batch struct: the
    fake decode reads the arrays."""


class FakeSampler:
    """Greedy (argmax) at temperature 0, else a seeded draw among the two best tokens."""

    def __init__(self, params: SamplingParams, banned: tuple[int, ...]) -> None:
        self.params = params
        self.banned = banned
        self.history: list[int] = []
        self.rng = np.random.default_rng(params.seed)
        self.freed = False
        self.turns = 0

    def sample(self, row: int, logits: np.ndarray) -> int | None:
        return self.sample_from(logits)

    def sample_from(self, logits: np.ndarray) -> int | None:
        logits = logits.astype(np.float64)
        for token, bias in self.params.logit_bias:
            logits[token] += bias
        logits[list(self.banned)] = -np.inf
        if not np.isfinite(logits).any():
            return None  # as the real sampler does when nothing is allowed
        best = np.argsort(-logits)[:2]
        token = int(best[0]) if self.params.temperature <= 0 else int(self.rng.choice(best))
        self.history.append(token)
        return token

    def accept(self, tokens: Sequence[int]) -> None:
        self.history.extend(tokens)

    def grammar_allows_end(self) -> bool:
        return True

    def begin_turn(self) -> None:
        self.turns += 1

    def free(self) -> None:
        self.freed = True


class FakeRunner:
    meta = META
    n_vocab = N_VOCAB
    can_shift = True
    costs = FakeCosts()

    def __init__(self, n_batch: int = 256, n_swa: int = 0, per_slot: bool = True, n_ubatch: int | None = None) -> None:
        """`per_slot`: ubatches as with one KV stream per slot (the executor's default)."""
        self.batch = FakeBatch(n_batch)
        self.per_slot = per_slot
        self.n_ubatch = n_ubatch or n_batch
        self.meta = replace(META, n_swa=n_swa)
        self.n_swa = n_swa
        self.kv: dict[int, list[int]] = {}  # seq_id -> tokens at positions 0..n-1
        self.kv_min: dict[int, int] = {}  # seq_id -> positions below it left the window
        self._rows: dict[int, np.ndarray] = {}
        self.fail_next_decode = False
        self.num_decodes = 0
        self.max_output_rows = 0  # the most rows with logits in one decode
        self.samplers: list[FakeSampler] = []
        self.adapters: AdapterSet = ()  # the LoRA adapter set of the next decode (use_adapters)
        self.kv_sets: dict[int, list[AdapterSet]] = {}  # seq_id -> the set each of its cells was computed under
        self.num_adapter_switches = 0
        self.loaded_adapters: set[str] = set()
        self.alora_adapters: set[str] = set()  # loaded from a path naming "alora": an aLoRA
        self.placed: list[tuple[int, int, AdapterSet]] = []  # (seq, position, adapter set) of each cell decoded
        self.adapter_files: dict[str, object] = {}

    def use_adapters(self, adapters: AdapterSet) -> None:
        assert all(name in self.loaded_adapters for name, _ in adapters), f"{adapters} are not all loaded"
        self.num_adapter_switches += adapters != self.adapters
        self.adapters = adapters

    def load_adapter(self, name: str, path: object) -> object:
        if "bad" in str(path):
            raise ValueError(f"{path} is not a LoRA adapter")
        self.loaded_adapters.add(name)
        if "alora" in str(path):
            self.alora_adapters.add(name)
        self.adapter_files[name] = path
        return {"name": name}

    def _may_follow(self, sets: list[AdapterSet], adapters: AdapterSet) -> bool:
        """A cell under `adapters` may follow cells all computed under them, or for an aLoRA
        the base's cells and then its own (its invocation comes after the base's context)."""
        first = next((i for i, x in enumerate(sets) if x == adapters), len(sets))
        alora = len(adapters) == 1 and adapters[0][0] in self.alora_adapters
        return (first == 0 or alora) and set(sets[:first]) <= {()} and set(sets[first:]) <= {adapters}

    def unload_adapter(self, name: str) -> object:
        if name in dict(self.adapters):  # as the real runner: the context drops it first
            self.adapters = ()
        self.loaded_adapters.remove(name)
        return self.adapter_files.pop(name)

    def decode(self) -> int:
        self.num_decodes += 1
        if self.fail_next_decode:
            self.fail_next_decode = False
            return 1
        b = self.batch
        self._rows.clear()
        self.max_output_rows = max(self.max_output_rows, int(b.logits[: b.num_tokens].sum()))
        n = b.num_tokens
        if self.per_slot:
            ubatches = split_equal([(int(b.seq[i]), int(b.pos[i])) for i in range(n)], self.n_ubatch)
        else:
            ubatches = [list(range(i, min(i + self.n_ubatch, n))) for i in range(0, n, self.n_ubatch)]
        for ubatch in ubatches:
            if self.n_swa:  # cells out of the window of each sequence's next position may be reused
                for seq in {int(b.seq[i]) for i in ubatch}:
                    held = len(self.kv.get(seq, []))
                    self.kv_min[seq] = max(self.kv_min.get(seq, 0), held - self.n_swa + 1) if held else 0
            for i in ubatch:
                self._place(i)
        return 0

    def _place(self, i: int) -> None:
        b = self.batch
        seq, pos, token = int(b.seq[i]), int(b.pos[i]), int(b.token[i])
        cells = self.kv.setdefault(seq, [])
        assert pos == len(cells), f"seq {seq}: token at position {pos}, but the KV holds {len(cells)}"
        sets = self.kv_sets.setdefault(seq, [])
        assert self._may_follow(sets, self.adapters), f"seq {seq}: decoded under {self.adapters} beside cells of {set(sets)}"
        sets.append(self.adapters)
        self.placed.append((seq, pos, self.adapters))
        assert self.holds_window(seq, pos), f"seq {seq}: position {pos} attends to cells already dropped"
        cells.append(token)
        if b.logits[i]:
            row = np.full(N_VOCAB, -10.0, dtype=np.float32)
            row[(next_token(token) + 1) % N_VOCAB] = 5.0
            row[next_token(token)] = 10.0
            self._rows[i] = row

    def holds_window(self, seq_id: int, pos: int) -> bool:
        """Whether a token at `pos` would find every cell of its window."""
        return self.kv_min.get(seq_id, 0) <= max(0, pos - self.n_swa + 1)

    def logits_row(self, row: int) -> np.ndarray:
        return self._rows[row]

    def piece(self, token: int, special: bool = False) -> bytes:
        return piece_of(token)

    def new_sampler(
        self, params: SamplingParams, n_ctx: int, banned_tokens: tuple[int, ...] = (), grammar: object | None = None
    ) -> FakeSampler:
        sampler = FakeSampler(params, banned_tokens)
        self.samplers.append(sampler)
        return sampler

    def seq_rm(self, seq_id: int, p0: int, p1: int = -1) -> bool:
        cells = self.kv.setdefault(seq_id, [])
        sets = self.kv_sets.setdefault(seq_id, [])
        for held in (cells, sets):
            if p0 < 0:
                held.clear()
            else:
                del held[p0 : (None if p1 < 0 else p1)]
        if len(cells) <= self.kv_min.get(seq_id, 0):  # nothing left that the KV holds
            cells.clear()
            sets.clear()
        if not cells:
            self.kv_min[seq_id] = 0
        return True

    def seq_cp(self, src: int, dst: int) -> None:
        self.kv[dst] = list(self.kv.get(src, []))
        self.kv_min[dst] = self.kv_min.get(src, 0)
        self.kv_sets[dst] = list(self.kv_sets.get(src, []))

    def seq_shift(self, seq_id: int, keep: int, discard: int) -> None:
        del self.kv[seq_id][keep : keep + discard]
        del self.kv_sets[seq_id][keep : keep + discard]
        self.kv_min[seq_id] = max(0, self.kv_min.get(seq_id, 0) - discard)

    def seq_state(self, seq_id: int) -> bytes:
        cells = self.kv.get(seq_id, [])
        # Like llama.cpp's state_write: cells out of the newest token's window are left out.
        lowest = max(self.kv_min.get(seq_id, 0), len(cells) - self.n_swa) if self.n_swa else 0
        return json.dumps({"tokens": cells, "min": lowest, "sets": self.kv_sets.get(seq_id, [])}).encode()

    def set_seq_state(self, seq_id: int, data: bytes) -> bool:
        state = json.loads(data)
        self.kv[seq_id] = list(state["tokens"])
        self.kv_min[seq_id] = state["min"] if state["tokens"] else 0
        whole = [state.get("adapters", ())] * len(state["tokens"])  # a state written by hand: one set
        self.kv_sets[seq_id] = [tuple((name, scale) for name, scale in cell) for cell in state.get("sets", whole)]
        return True

    def seq_pos_min(self, seq_id: int) -> int:
        return self.kv_min.get(seq_id, 0) if self.kv.get(seq_id) else -1

    def seq_pos_max(self, seq_id: int) -> int:
        return len(self.kv.get(seq_id, [])) - 1

    def embed(self, inputs: list[tuple[int, ...]]) -> list[np.ndarray]:
        return [np.full(4, float(len(tokens)), dtype=np.float32) for tokens in inputs]
