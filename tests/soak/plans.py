"""What the combination fuzzer sends: seeded plans, each drawn whole before the run.

A `Plan` is one Generate call: its SessionConfig, its inputs (one per turn), how the
client ends it, and at most one adversarial value. Plan i of seed s is the same on
every machine (`draw_plans`), so a failure names its seed and index and
`python -m tests.soak.combos --seed s --only i` sends that call again.
Everything the oracle (tests/soak/oracle.py) predicts is a property of the plan:
which status its ending implies, which field an adversarial value must be refused on,
what its constraint's output must look like.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass

from google.protobuf import text_format
from llmserve.client import make_input, pb

# GBNF grammar -> (the regex its complete output matches, the regex every prefix of it matches)
GRAMMARS: dict[str, tuple[str, str]] = {
    'root ::= "yes"': (r"yes", r"(y(es?)?)?"),
    'root ::= "yes" | "no"': (r"yes|no", r"(y(es?)?)?|no?"),
    "root ::= [a-z]+": (r"[a-z]+", r"[a-z]*"),
    'root ::= "{" [a-z ]* "}"': (r"\{[a-z ]*\}", r"(\{[a-z ]*\}?)?"),
}
SCHEMAS = [
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}, "required": ["a"]},
    {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 3},
    {"type": "string", "pattern": "^[a-c]{2,5}$"},
]
EOG_IDS = (1, 106, 212)  # gemma-3's end-of-generation ids: a -inf bias on them all keeps a turn going
STOP_STRINGS = ["\n", "yes", "a", ".", "}"]
PROMPTS = ["Answer yes or no: is water wet?", "List three colours:", "Write JSON:", "Say something short."]
ENDINGS = ["close", "close", "close", "cancel_in_band", "cancel_call", "deadline", "disconnect",
           "early_turn", "extra_end_of_turn"]
DEADLINES_S = [0.05, 0.3, 1.0]


def _set(path: str, value: object):  # type: ignore[no-untyped-def]
    def apply(c: pb.SessionConfig) -> None:
        *parents, name = path.split(".")
        target = c
        for p in parents:
            target = getattr(target, p)
        setattr(target, name, value)
    return apply


# name -> (how it changes the config, the field the server must name when it refuses it)
ADVERSARIAL = {
    "seed_default": (_set("sampling.seed", 0xFFFFFFFF), "config.sampling.seed"),
    "schema_pattern_1e6": (_set("constraint.json_schema", json.dumps({"type": "string", "pattern": "^a{1,1000000}$"})),
                           "config.constraint.json_schema"),
    "schema_min_items_1e8": (_set("constraint.json_schema", json.dumps(
        {"type": "array", "items": {"type": "integer"}, "minItems": 100000000})), "config.constraint.json_schema"),
    "grammar_left_recursive": (_set("constraint.grammar", 'root ::= root "a" | "a"'), "config.constraint.grammar"),
    "grammar_broken": (_set("constraint.grammar", "root ::= ((("), "config.constraint.grammar"),
    "max_tokens_huge": (_set("stopping.max_tokens", 10**7), "config.stopping.max_tokens"),
    "temperature_nan": (_set("sampling.temperature", float("nan")), "config.sampling.temperature"),
    "n_too_many": (_set("n", 99), "config.n"),
    "stop_id_outside": (lambda c: c.stopping.stop_token_ids.append(262144), "config.stopping.stop_token_ids"),
    "bias_outside": (lambda c: c.sampling.logit_bias.__setitem__(-3, 1.0), "config.sampling.logit_bias"),
}


@dataclass
class Plan:
    """One call. `prompts` holds one input per turn; `deadline_s` is the call's timeout
    when it ends by its deadline (else the run's call timeout applies)."""

    index: int
    config: pb.SessionConfig
    chat: bool
    prompts: list[str]
    ending: str
    deadline_s: float | None = None
    adversarial: str = ""

    @property
    def turns(self) -> int:
        return len(self.prompts)

    @property
    def num_samples(self) -> int:
        return max(self.config.n, 1)

    @property
    def label(self) -> str:
        return self.adversarial or f"valid, ends by {self.ending}"

    def describe(self) -> str:
        config = text_format.MessageToString(self.config, as_one_line=True)
        return (f"plan {self.index}: ends by {self.ending}, chat={self.chat}, turns={self.turns}, "
                f"deadline_s={self.deadline_s}, adversarial={self.adversarial!r}, prompts={self.prompts}, "
                f"config {{{config}}}")

    def input(self, turn: int) -> pb.Input:
        text = self.prompts[turn]
        if not self.chat:
            return make_input(text)
        return pb.Input(messages=pb.ChatMessages(messages=[pb.ChatMessage(role="user", content=text)]))

    def grammar_regexes(self) -> tuple[str, str] | None:
        return GRAMMARS.get(self.config.constraint.grammar) if self.config.constraint.grammar else None

    def schema(self) -> dict | None:  # type: ignore[type-arg]
        return json.loads(self.config.constraint.json_schema) if self.config.constraint.json_schema else None

    def matches_grammar(self, text: str, complete: bool) -> bool:
        regexes = self.grammar_regexes()
        return regexes is None or re.fullmatch(regexes[0] if complete else regexes[1], text) is not None


def draw(index: int, rng: random.Random, session_ids: list[str]) -> Plan:
    c = pb.SessionConfig()
    c.sampling.temperature = rng.choice([0.0, 0.0, 0.7])
    c.sampling.seed = rng.randrange(1000)
    if rng.random() < 0.2:
        c.sampling.dry_multiplier = 0.8
    if rng.random() < 0.2:
        c.sampling.repeat_penalty = 1.1
    bias = rng.random()
    if bias < 0.2:
        for t in EOG_IDS:
            c.sampling.logit_bias[t] = float("-inf")
    elif bias < 0.3:
        c.sampling.logit_bias[rng.randrange(3, 5000)] = rng.choice([-5.0, 5.0, float("-inf")])
    kind = rng.random()
    if kind < 0.3:
        c.constraint.grammar = rng.choice(sorted(GRAMMARS))
    elif kind < 0.5:
        c.constraint.json_schema = json.dumps(rng.choice(SCHEMAS))
    c.stopping.max_tokens = rng.randint(1, 20)
    c.stopping.min_tokens = rng.choice([0, 0, rng.randint(0, c.stopping.max_tokens)])
    c.stopping.ignore_eos = rng.random() < 0.3
    if rng.random() < 0.2:
        c.stopping.stop.append(rng.choice(STOP_STRINGS))
    if rng.random() < 0.15:
        c.stopping.stop_token_ids.append(rng.randrange(200, 3000))
    if rng.random() < 0.3:
        c.output.top_logprobs = rng.choice([0, 3])
    if rng.random() < 0.08:
        c.output.prompt_logprobs = True
    chat = rng.random() < 0.35
    if rng.random() < 0.3:  # a named session keeps to one input kind: ids per kind
        c.session_id = rng.choice(session_ids) + ("-chat" if chat else "-text")
    elif rng.random() < 0.25:
        c.n = rng.randint(2, 3)
    ending = rng.choice(ENDINGS)
    prompts = [rng.choice(PROMPTS) for _ in range(rng.randint(1, 3))]
    plan = Plan(index, c, chat=chat, prompts=prompts, ending=ending,
                deadline_s=rng.choice(DEADLINES_S) if ending == "deadline" else None)
    if rng.random() < 0.2:
        plan.adversarial = rng.choice(sorted(ADVERSARIAL))
        ADVERSARIAL[plan.adversarial][0](c)
    return plan


def draw_plans(calls: int, seed: int) -> list[Plan]:
    rng = random.Random(seed)
    ids = [f"combo-{seed}-{i}" for i in range(3)]
    return [draw(i, rng, ids) for i in range(calls)]
