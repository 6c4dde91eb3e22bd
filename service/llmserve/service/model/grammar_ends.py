"""Which rules of a GBNF grammar can never end: those that derive no finite text (every
way through them leads back into them, as a tree whose `children` is required and never
empty). A sampler held to such a rule writes until its token limit and never closes the
value, so a JSON schema whose grammar reaches one is refused (grammar_sources.py).

Only a rule that reaches a cycle of rules can fail to end, so a first pass at C speed
(regular expressions) finds the rules each rule names and sets aside those that reach no
cycle; the rest are read in full (rules, literals, character classes, groups,
alternatives, the postfix operators `* + ?` and `{m,n}`), without recursion: the
converter nests groups a thousand deep for `maxItems: 1000`. The cost is about that of
llama.cpp's own parse. Runs in the grammar worker, under its CPU budget.
"""

from __future__ import annotations

import re

_TOKEN = re.compile(r"""
    (?P<skip>\s+|\#[^\n]*)
  | (?P<term>"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]|\.)
  | (?P<name>[a-zA-Z0-9_-]+)(?P<defines>\s*::=)?
  | (?P<op>[()|*+?])
  | (?P<repeat>\{\s*(?P<low>\d+)\s*(?:,\s*\d*\s*)?\})
""", re.VERBOSE | re.DOTALL)

_TEXTS = re.compile(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]|\#[^\n]*')  # literals, classes, comments
_DEFINES = re.compile(r"([a-zA-Z0-9_-]+)\s*::=")
_NAMES = re.compile(r"[a-zA-Z0-9_-]+")

# A node is (kind, argument): ("term", None), ("ref", name), ("seq" | "alt", child indices),
# ("opt" | "plus", child index). Children come before their parents in the node list.
_Node = tuple[str, object]


def unending_rules(gbnf: str) -> list[str]:
    """The rules reachable from `root` that derive no finite text (empty when all can end).
    ValueError when the text is not GBNF this reading understands."""
    bare = _TEXTS.sub('"t"', gbnf)  # at C speed: a large grammar is mostly texts
    heads = list(_DEFINES.finditer(bare))
    bodies = {head[1]: (head.end(), following.start() if following else len(bare))
              for head, following in zip(heads, [*heads[1:], None], strict=True)}
    named = {name: set(_NAMES.findall(bare, *span)) & bodies.keys() for name, span in bodies.items()}
    cyclic = _reaching_cycles(named)  # a rule that reaches no cycle ends: its text is finite
    nodes, spans, refs = _read("".join(f"{name} ::= {bare[slice(*bodies[name])]}\n" for name in cyclic))
    users: dict[str, set[str]] = {}
    for name, others in refs.items():
        for other in others:
            users.setdefault(other, set()).add(name)
    ends = [False] * len(nodes)
    ending: set[str] = set()
    todo = list(spans)
    while todo:  # a rule is looked at again only when a rule it names is found to end
        name = todo.pop()
        if name not in ending and _ends(nodes, spans[name], ends, ending, spans):
            ending.add(name)
            todo.extend(users.get(name, ()))
    reachable, todo = {"root"}, ["root"]
    while todo:
        for name in named.get(todo.pop(), ()):
            if name not in reachable:
                reachable.add(name)
                todo.append(name)
    return sorted(name for name in reachable if name in spans and name not in ending)


def _reaching_cycles(named: dict[str, set[str]]) -> list[str]:
    """The rules from which a cycle of rules can be reached: peel off, until none is left,
    each rule that names only rules already peeled."""
    waiting = {name: len(others) for name, others in named.items()}
    users: dict[str, list[str]] = {}
    for name, others in named.items():
        for other in others:
            users.setdefault(other, []).append(name)
    todo = [name for name, count in waiting.items() if count == 0]
    while todo:
        for user in users.get(todo.pop(), ()):
            waiting[user] -= 1
            if waiting[user] == 0:
                todo.append(user)
    return [name for name, count in waiting.items() if count > 0]


def _ends(nodes: list[_Node], span: range, ends: list[bool], ending: set[str], spans: dict[str, range]) -> bool:
    """Whether a rule (its nodes: `span`, children first) derives a finite text, given the
    rules known to end (a rule never defined is left to llama.cpp's parser, which refuses it)."""
    for i in span:
        kind, arg = nodes[i]
        if kind == "term" or kind == "opt":
            ends[i] = True
        elif kind == "ref":
            ends[i] = arg in ending or arg not in spans
        elif kind == "plus":
            ends[i] = ends[arg]  # type: ignore[index]
        elif kind == "seq":
            ends[i] = all(ends[c] for c in arg)  # type: ignore[attr-defined]
        else:
            ends[i] = any(ends[c] for c in arg)  # type: ignore[attr-defined]
    return ends[span[-1]]


def _read(gbnf: str) -> tuple[list[_Node], dict[str, range], dict[str, set[str]]]:
    """The nodes, each rule's nodes (its top node last), and the rules each rule names.
    Node 0 is the one that always ends: a text, or anything under `?`, `*` or `{0,n}`."""
    reader, position = _Reader(), 0
    for match in _TOKEN.finditer(gbnf):
        if match.start() != position:
            break
        position = match.end()
        if match.lastgroup == "defines":
            reader.define(match["name"])
        elif match.lastgroup != "skip":
            reader.token(match)
    if position != len(gbnf):
        raise ValueError(f"unexpected {gbnf[position:position + 20]!r} in the grammar")
    reader.finish()
    return reader.nodes, reader.rules, reader.refs


class _Reader:
    """`_read`'s state: the nodes so far, the rule being read and its open groups."""

    def __init__(self) -> None:
        self.nodes: list[_Node] = [("term", None)]
        self.rules: dict[str, range] = {}
        self.refs: dict[str, set[str]] = {}
        self.name, self.start = "", 1
        self.frames: list[list[list[int]]] = []  # open groups, each a list of alternatives

    def add(self, node: _Node) -> int:
        self.nodes.append(node)
        return len(self.nodes) - 1

    def close(self, alternatives: list[list[int]]) -> int:
        sequences = [[i for i in sequence if i] for sequence in alternatives]  # what always ends drops out
        if any(not sequence for sequence in sequences):
            return 0
        if len(sequences) == 1 and len(sequences[0]) == 1:
            return sequences[0][0]
        return self.add(("alt", [sequence[0] if len(sequence) == 1 else self.add(("seq", sequence))
                                 for sequence in sequences]))

    def define(self, name: str) -> None:
        """`name ::=`: the rule before it ends."""
        if len(self.frames) > 1:
            raise ValueError(f"rule {name} starts inside a group")
        if self.name:
            self.rules[self.name] = _span(self.start, self.close(self.frames[0]))
        self.name, self.frames, self.start = name, [[[]]], len(self.nodes)
        self.refs.setdefault(name, set())

    def token(self, match: re.Match[str]) -> None:
        """A text, a rule's name, a group's bracket, `|` or a repetition."""
        if not self.frames:
            raise ValueError("the grammar does not start with a rule")
        kind, text, sequence = match.lastgroup, match.group(), self.frames[-1][-1]
        if kind == "term":
            sequence.append(0)
        elif kind == "name":
            sequence.append(self.add(("ref", text)))
            self.refs[self.name].add(text)
        elif text == "(":
            self.frames.append([[]])
        elif text == ")":
            if len(self.frames) < 2:
                raise ValueError("unbalanced ) in the grammar")
            group = self.close(self.frames.pop())
            self.frames[-1][-1].append(group)
        elif text == "|":
            self.frames[-1].append([])
        elif not sequence:
            raise ValueError("a repetition follows nothing in the grammar")
        elif text in ("*", "?") or (kind == "repeat" and int(match["low"]) == 0):
            sequence[-1] = 0
        elif sequence[-1]:
            sequence[-1] = self.add(("plus", sequence[-1]))

    def finish(self) -> None:
        """The end of the grammar: the last rule ends."""
        if self.name:
            if len(self.frames) > 1:
                raise ValueError("unbalanced ( in the grammar")
            self.rules[self.name] = _span(self.start, self.close(self.frames[0]))


def _span(start: int, top: int) -> range:
    """A rule's nodes to look at, its top node last (node 0 alone when it always ends)."""
    return range(start, top + 1) if top else range(0, 1)
