"""What the combination fuzzer sends: seeded plans, each drawn whole before the run.

A `Plan` is one call: its SessionConfig, its inputs (one per turn), how the client ends
it, at most one adversarial value, and its surface. A gRPC plan is one Generate call; an
HTTP plan is the same config as one OpenAI request (tests/soak/http_translate.py):
`/v1/chat/completions` for chat or a constraint, else `/v1/completions`, whole or streamed.
HTTP plans are drawn from what that surface expresses: one turn, no session_id, stop ids,
prompt logprobs or DRY; endings `close`, `deadline` (x-request-timeout) or (streamed)
`disconnect`; multi-turn and named-session plans are drawn for gRPC only. Plan i of seed s is the same on
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

import jsonschema
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
# disconnect: the client drops a stream after its first text; deadline: the x-request-timeout header
HTTP_ENDINGS = ["close", "close", "close", "close", "disconnect", "deadline"]
# regex -> (what its complete output matches, what every prefix of it matches)
REGEXES: dict[str, tuple[str, str]] = {
    r"[0-9]{1,3}": (r"[0-9]{1,3}", r"[0-9]{0,3}"),
    r"(yes|no), [a-z]{1,6}": (r"(yes|no), [a-z]{1,6}", r"(y(es?)?)?|no?|(yes|no),( [a-z]{0,6})?"),
}
CHOICES = [["red", "green", "blue"], ["yes", "no"]]
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
# name -> the field (OpenAI's `param`) the HTTP surface must name; stop ids have no HTTP field
HTTP_ADVERSARIAL = {
    "seed_default": "seed", "schema_pattern_1e6": "response_format.json_schema.schema",
    "schema_min_items_1e8": "response_format.json_schema.schema", "grammar_left_recursive": "grammar",
    "grammar_broken": "grammar", "max_tokens_huge": "max_tokens", "temperature_nan": "temperature", "n_too_many": "n",
    "bias_outside": "logit_bias",
}

# an HTTP plan sent to /v1/responses or /v1/messages: the adversarial values its body can carry, and the field named
API_ADVERSARIAL = {
    "responses": {"schema_pattern_1e6": "text.format.schema", "schema_min_items_1e8": "text.format.schema",
                  "max_tokens_huge": "max_output_tokens", "temperature_nan": "temperature"},
    "messages": {"max_tokens_huge": "max_tokens", "temperature_nan": "temperature"},
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
    surface: str = "grpc"  # or "http"
    stream: bool = False  # HTTP: server-sent events (else one whole reply)
    api: str = "openai"  # HTTP: chat or completions; "responses" or "messages": cut to that API (as_api)

    @property
    def turns(self) -> int:
        return len(self.prompts)

    @property
    def num_samples(self) -> int:
        return max(self.config.n, 1)

    @property
    def label(self) -> str:
        label = self.adversarial or f"valid, ends by {self.ending}"
        return label if self.surface == "grpc" else f"{'http' if self.api == 'openai' else self.api}: {label}"

    @property
    def refused_field(self) -> str:
        """The field a server must name when it refuses the adversarial value."""
        if self.surface == "grpc":
            return ADVERSARIAL[self.adversarial][1]
        return (API_ADVERSARIAL[self.api] if self.api != "openai" else HTTP_ADVERSARIAL)[self.adversarial]

    def describe(self) -> str:
        config = text_format.MessageToString(self.config, as_one_line=True)
        http = f"surface http, api={self.api}, stream={self.stream}, " if self.surface == "http" else ""
        return (f"plan {self.index}: {http}ends by {self.ending}, chat={self.chat}, turns={self.turns}, "
                f"deadline_s={self.deadline_s}, adversarial={self.adversarial!r}, prompts={self.prompts}, "
                f"config {{{config}}}")

    def input(self, turn: int) -> pb.Input:
        text = self.prompts[turn]
        if not self.chat:
            return make_input(text)
        return pb.Input(messages=pb.ChatMessages(messages=[pb.ChatMessage(role="user", content=text)]))

    def grammar_regexes(self) -> tuple[str, str] | None:
        """(what a complete output matches, what each prefix matches) for a grammar, regex or choice."""
        c = self.config.constraint
        kind = c.WhichOneof("kind")
        if kind == "choice":
            return "|".join(map(re.escape, c.choice.values)), "|".join(_prefixes(v) for v in c.choice.values)
        return (GRAMMARS.get(c.grammar) if kind == "grammar" else REGEXES.get(c.regex) if kind == "regex" else None)

    def schema(self) -> dict | None:  # type: ignore[type-arg]
        if self.config.constraint.json_object:
            return {"type": "object"}
        return json.loads(self.config.constraint.json_schema) if self.config.constraint.json_schema else None

    def matches_grammar(self, text: str, complete: bool) -> bool:
        regexes = self.grammar_regexes()
        return regexes is None or re.fullmatch(regexes[0] if complete else regexes[1], text) is not None

    def constraint_problems(self, text: str, complete: bool) -> list[str]:
        """How `text` breaks the plan's constraint: any prefix of a valid output passes,
        a `complete` one must be valid (a grammar, regex or choice match; JSON for its schema)."""
        problems = [] if self.matches_grammar(text, complete) else [
            f"{text!r} breaks the constraint {text_format.MessageToString(self.config.constraint, as_one_line=True)}"]
        schema = self.schema()
        if schema is not None and complete:
            try:
                jsonschema.validate(json.loads(text), schema)
            except (ValueError, jsonschema.ValidationError) as exc:
                problems.append(f"{text!r} is not valid for the schema: {str(exc).splitlines()[0]}")
        return problems


def _prefixes(word: str) -> str:
    """A regex of every prefix of `word` ("" included)."""
    return "".join(f"(?:{re.escape(ch)}" for ch in word) + ")?" * len(word)


def _constraint(c: pb.SessionConfig, kind: float) -> None:
    """A constraint for the plan. The newer kinds (regex, choice, json_object) are drawn
    from `kind` alone, so the main draw's sequence stays as it was before them."""
    if kind < 0.5:
        return  # a grammar or a schema, drawn by the main draw
    side = random.Random(kind)
    pick = side.random()
    if pick < 0.2:
        c.constraint.regex = side.choice(sorted(REGEXES))
    elif pick < 0.3:
        c.constraint.choice.values.extend(side.choice(CHOICES))
    elif pick < 0.35:
        c.constraint.json_object = True


def draw(index: int, rng: random.Random, session_ids: list[str], surface: str = "grpc") -> Plan:
    """Plan `index`. An HTTP plan draws what HTTP cannot express as its nearest HTTP form
    (presence_penalty for DRY, -100 for a -inf bias) or not at all; a gRPC plan's draws
    are the same as before the HTTP surface existed."""
    http = surface == "http"
    ban = -100.0 if http else float("-inf")  # OpenAI's bias range is [-100, 100]
    c = pb.SessionConfig()
    c.sampling.temperature = rng.choice([0.0, 0.0, 0.7])
    c.sampling.seed = rng.randrange(1000)
    if rng.random() < 0.2:
        if http:
            c.sampling.presence_penalty = 0.5
        else:
            c.sampling.dry_multiplier = 0.8
    if rng.random() < 0.2:
        c.sampling.repeat_penalty = 1.1
    bias = rng.random()
    if bias < 0.2:
        for t in EOG_IDS:
            c.sampling.logit_bias[t] = ban
    elif bias < 0.3:
        c.sampling.logit_bias[rng.randrange(3, 5000)] = rng.choice([-5.0, 5.0, ban])
    kind = rng.random()
    if kind < 0.3:
        c.constraint.grammar = rng.choice(sorted(GRAMMARS))
    elif kind < 0.5:
        c.constraint.json_schema = json.dumps(rng.choice(SCHEMAS))
    _constraint(c, kind)
    c.stopping.max_tokens = rng.randint(1, 20)
    c.stopping.min_tokens = rng.choice([0, 0, rng.randint(0, c.stopping.max_tokens)])
    c.stopping.ignore_eos = rng.random() < 0.3
    if rng.random() < 0.2:
        c.stopping.stop.append(rng.choice(STOP_STRINGS))
    if rng.random() < 0.15 and not http:
        c.stopping.stop_token_ids.append(rng.randrange(200, 3000))
    if rng.random() < 0.3:
        c.output.top_logprobs = rng.choice([0, 3])
    if rng.random() < 0.08 and not http:
        c.output.prompt_logprobs = True
    chat = rng.random() < 0.35
    if rng.random() < 0.3:  # a named session keeps to one input kind: ids per kind
        if not http:
            c.session_id = rng.choice(session_ids) + ("-chat" if chat else "-text")
    elif rng.random() < 0.25:
        c.n = rng.randint(2, 3)
    ending = rng.choice(HTTP_ENDINGS if http else ENDINGS)
    prompts = [rng.choice(PROMPTS) for _ in range(rng.randint(1, 3))]
    plan = Plan(index, c, chat=chat, prompts=prompts[:1] if http else prompts, ending=ending,
                deadline_s=rng.choice(DEADLINES_S) if ending == "deadline" else None, surface=surface)
    if rng.random() < 0.2:
        plan.adversarial = rng.choice(sorted(HTTP_ADVERSARIAL if http else ADVERSARIAL))
        ADVERSARIAL[plan.adversarial][0](c)
    if http:  # constraints are a chat field over HTTP; a disconnect needs a stream to drop
        plan.chat = chat or bool(c.constraint.WhichOneof("kind"))
        plan.stream = ending == "disconnect" or rng.random() < 0.5
    return plan


def as_api(plan: Plan, api: str) -> Plan:
    """An HTTP plan cut to what a Responses or Messages body says: one user message,
    temperature, the token limit; Responses also top_logprobs and a JSON schema or object,
    Messages stop strings (`stop_sequences`); an adversarial value only where that API has a
    field for it (else the plan is valid)."""
    c = plan.config
    for name in ("seed", "presence_penalty", "repeat_penalty", "logit_bias"):
        c.sampling.ClearField(name)
    for name in ("min_tokens", "ignore_eos", *(("stop",) if api == "responses" else ())):
        c.stopping.ClearField(name)
    c.ClearField("n")
    if api == "messages" or c.constraint.WhichOneof("kind") not in ("json_schema", "json_object"):
        c.ClearField("constraint")
    if api == "messages":
        c.ClearField("output")  # no logprobs in Anthropic's API
    plan.adversarial = plan.adversarial if plan.adversarial in API_ADVERSARIAL[api] else ""
    plan.chat, plan.api = True, api
    return plan


SURFACES = ("grpc", "http", "mixed", *API_ADVERSARIAL)


def draw_plans(calls: int, seed: int, surface: str = "grpc", models: tuple[str, ...] = ()) -> list[Plan]:
    """`surface` grpc or http: every plan on it; mixed: each plan's surface drawn (half each)
    by a second generator, so the plans of a seed differ only in which surface they take;
    responses or messages: HTTP plans cut to that API (`as_api`). `models`: each plan's model
    drawn from these names ("" the default) by a third generator (`on_model`)."""
    rng, sides = random.Random(seed), random.Random(f"surfaces-{seed}")
    ids = [f"combo-{seed}-{i}" for i in range(3)]
    pick = (lambda: surface) if surface != "mixed" else (lambda: "http" if sides.random() < 0.5 else "grpc")
    plans = [as_api(draw(i, rng, ids, "http"), surface) if surface in API_ADVERSARIAL else draw(i, rng, ids, pick())
             for i in range(calls)]
    which = random.Random(f"models-{seed}")
    return [on_model(plan, which.choice(models)) for plan in plans] if models else plans


def on_model(plan: Plan, model: str) -> Plan:
    """The plan sent to `model` ("" the default): `SessionConfig.model` (HTTP: the body's
    `model`); a named session keeps to one model (each model has its own named sessions)."""
    if model:
        plan.config.model = model
        if plan.config.session_id:
            plan.config.session_id += f"-{model}"
    return plan
