"""Scheduler driven by a fake runner (vLLM-style): no llama_cpp import."""

from __future__ import annotations

import random
from dataclasses import dataclass

from llmserve.service.engine.executor.scheduler import PlannerState, Scheduler, SeqDemand, StepPlan


@dataclass
class FakeSeq:
    key: int
    prompt_left: int
    gen_left: int
    decoding: bool = False

    def demand(self) -> SeqDemand:
        return SeqDemand(self.key, self.decoding, 0 if self.decoding else self.prompt_left)


class FakeRunner:
    """Applies a plan: prefill consumes prompt tokens; a finished prompt starts decoding."""

    def __init__(self, seqs: list[FakeSeq]) -> None:
        self.seqs = {s.key: s for s in seqs}
        self.steps: list[StepPlan] = []

    def run(self, plan: StepPlan) -> None:
        self.steps.append(plan)
        for key in plan.decode:
            seq = self.seqs[key]
            seq.gen_left -= 1
            if seq.gen_left == 0:
                del self.seqs[key]
        for key, n in plan.prefill:
            seq = self.seqs[key]
            seq.prompt_left -= n
            if seq.prompt_left == 0:
                seq.decoding = True


DECODING = [SeqDemand(k, True, 0) for k in (90, 91, 92, 93)]  # four streams decode meanwhile


def test_decode_first_then_prefill_within_budget() -> None:
    sched = Scheduler(n_batch=8, n_ubatch=8, max_embed_seqs=4)
    plan = sched.plan(
        [SeqDemand(1, True, 0), SeqDemand(2, False, 20), SeqDemand(3, True, 0)], embed_sizes=[]
    )
    assert plan.decode == (1, 3)
    assert plan.prefill == ((2, 6),)
    assert plan.num_tokens == 8


def test_prompts_finish_one_after_another_not_all_together() -> None:
    """Equal shares made four equal prompts all finish at the end; now the first that
    came finishes after a quarter of the work, and the others follow."""
    sched = Scheduler(n_batch=64, n_ubatch=64, max_embed_seqs=4, prefill_budget=40)
    left = {k: 400 for k in (1, 2, 3, 4)}
    finished: dict[int, int] = {}
    state = PlannerState()  # what each plan leaves for the next, as the executor's step keeps it
    for step in range(1, 100):
        plan = sched.plan([*DECODING, *(SeqDemand(k, False, n) for k, n in left.items() if n)], [], state=state)
        state = plan.next_state
        assert sum(n for _, n in plan.prefill) == 40
        for key, n in plan.prefill:
            left[key] -= n
            if not left[key]:
                finished[key] = step
        if len(finished) == 4:
            break
    assert finished == {1: 10, 2: 20, 3: 30, 4: 40}


def test_a_short_prompt_is_not_queued_behind_a_long_one() -> None:
    sched = Scheduler(n_batch=64, n_ubatch=64, max_embed_seqs=4, prefill_budget=40)
    first = sched.plan([*DECODING, SeqDemand(1, False, 1000)], [])  # the long prompt came first
    plan = sched.plan([*DECODING, SeqDemand(1, False, 960), SeqDemand(2, False, 12)], [], state=first.next_state)
    assert dict(plan.prefill) == {1: 28, 2: 12}  # the short one done in one step, the oldest keeps the rest


def test_the_oldest_prompt_always_gets_an_equal_share() -> None:
    """Short prompts arriving every step cannot starve a long one: the oldest waiting prompt
    gets at least budget / (prompts waiting)."""
    sched = Scheduler(n_batch=64, n_ubatch=64, max_embed_seqs=4, prefill_budget=32)
    long_left, key, state = 200, 100, PlannerState()
    for _ in range(200):
        short = [SeqDemand(key + i, False, 8) for i in range(3)]  # 24 tokens of new short prompts each step
        key += 3
        step = sched.plan([*DECODING, SeqDemand(1, False, long_left), *short], [], state=state)
        plan, state = dict(step.prefill), step.next_state
        assert plan[1] >= 32 // 4
        long_left -= plan[1]
        if not long_left:
            break
    assert long_left == 0


def test_simulation_every_sequence_completes_and_batches_stay_bounded() -> None:
    rng = random.Random(7)
    seqs = [FakeSeq(k, rng.randint(1, 300), rng.randint(1, 40)) for k in range(1, 17)]
    runner = FakeRunner(seqs)
    sched = Scheduler(n_batch=64, n_ubatch=64, max_embed_seqs=8)
    state = PlannerState()
    for _ in range(10_000):
        if not runner.seqs:
            break
        plan = sched.plan([s.demand() for s in runner.seqs.values()], [], state=state)
        state = plan.next_state
        assert not plan.is_empty
        assert plan.num_tokens <= 64
        decoding = {s.key for s in runner.seqs.values() if s.decoding}
        assert set(plan.decode) == decoding  # no generating sequence ever skips a step
        runner.run(plan)
    assert not runner.seqs


def test_embedding_steps_alternate_with_generation_and_pack_one_ubatch() -> None:
    sched = Scheduler(n_batch=32, n_ubatch=32, max_embed_seqs=3)
    gen = [SeqDemand(1, True, 0)]
    sizes = [10, 10, 10, 10]
    kinds, state = [], PlannerState()
    for _ in range(4):
        plan = sched.plan(gen, sizes, state=state)
        state = plan.next_state
        kinds.append("embed" if plan.is_embedding else "gen")
        if plan.is_embedding:
            assert plan.num_embed == 3  # three fit 32 tokens; max 3 sequences
    assert kinds == ["embed", "gen", "embed", "gen"]
    assert sched.plan([], [20, 20]).num_embed == 1  # 40 tokens do not fit one ubatch
    assert sched.plan([], []).is_empty


def test_prefill_budget_caps_prompts_only_while_others_decode() -> None:
    from llmserve.service.engine.executor.scheduler import PrefillPacer

    scheduler = Scheduler(n_batch=512, n_ubatch=512, max_embed_seqs=4, prefill_budget=64)
    alone = scheduler.plan([SeqDemand(1, False, 1400)], [])
    assert alone.prefill == ((1, 512),)  # nothing decodes: the whole batch
    two = [SeqDemand(1, True, 0), SeqDemand(4, True, 0)]
    busy = scheduler.plan([*two, SeqDemand(2, False, 1400), SeqDemand(3, False, 1400)], [], state=alone.next_state)
    assert busy.prefill == ((2, 64),)  # the oldest (a tie: the lower key) first, then the closest to done: the same
    burst = scheduler.plan([SeqDemand(1, True, 0), *(SeqDemand(k, False, 150) for k in range(10, 16))], [],
                           state=busy.next_state)
    assert sum(n for _, n in burst.prefill) == 6 * 64  # six prompts wait behind one stream: six times the cap
    pacer = PrefillPacer(max_itl_s=0.5)
    assert pacer.budget() == pacer.min_chunk_tokens  # nothing measured yet
    for _ in range(20):
        pacer.observe(0.070, 8, 0)  # a decode-only step: 70 ms
        pacer.observe(0.070 + 0.002 * 100, 8, 100)  # 100 prompt tokens cost 2 ms each
    assert 205 <= pacer.budget() <= 225  # (500 - 70) / 2 = 215 tokens keep a step within 500 ms
    for _ in range(40):
        pacer.observe(0.600, 16, 0)  # decode steps alone exceed the bound: the smallest chunk
    assert pacer.budget() == pacer.min_chunk_tokens
    auto = PrefillPacer()  # the default: the bound is AUTO_ITL_STEPS decode steps
    for _ in range(20):
        auto.observe(0.070, 8, 0)
        auto.observe(0.070 + 0.002 * 100, 8, 100)
    assert auto.AUTO_ITL_STEPS == 10
    assert 305 <= auto.budget() <= 325  # (10 * 70 - 70) / 2 = 315 tokens
    for _ in range(40):
        auto.observe(0.035, 4, 0)  # a faster machine (or fewer streams): steps half as long
    assert 150 <= auto.budget() <= 165  # and the gap with them: (350 - 35) / 2 = 157
    assert 65 <= auto.budget(num_groups=2) <= 75  # two groups' steps make a gap: (350 / 2 - 35) / 2 = 70
