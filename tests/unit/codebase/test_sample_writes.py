"""A sample owns its writes (issue 40): outside engine/executor/sample.py, no service module assigns,
augments or deletes an attribute of a `Sample`, nor changes one of its lists in place; a
`Turn`'s state is written in sample.py and turn.py alone. Code elsewhere calls a method named
for what it records (give up a slot, accept a draft token, record a picked token, ...).

Read with ast, nothing imported. The attribute names come from the classes themselves (every
`self.X` that `Sample` assigns, every field of `Turn`), so a new attribute is covered as soon
as it exists. A write counts when its target is `<anything but self>.X` with X one of those
names: a class writing its own attributes (`self.key = ...` in `Session`) is its own business."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "service" / "llmserve").is_dir())
SERVICE = ROOT / "service" / "llmserve" / "service"
ENGINE = SERVICE / "engine"
MUTATORS = {"append", "extend", "clear", "pop", "remove", "insert", "sort", "reverse", "popleft", "update", "add"}


def _class(path: Path, name: str) -> ast.ClassDef:
    tree = ast.parse(path.read_text())
    return next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name)


def _sample_attributes() -> tuple[set[str], set[str]]:
    """Every attribute `Sample` assigns on self, and of them those that hold a list."""
    names: set[str] = set()
    lists: set[str] = set()
    for node in ast.walk(_class(ENGINE / "executor" / "sample.py", "Sample")):
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        else:
            targets = node.targets if isinstance(node, ast.Assign) else []
        for target in [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]:
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                names.add(target.attr)
                annotation = ast.unparse(node.annotation) if isinstance(node, ast.AnnAssign) else ""
                if annotation.startswith("list") or isinstance(node.value, ast.List):
                    lists.add(target.attr)
    return names, lists


def _turn_fields() -> tuple[set[str], set[str]]:
    body = _class(ENGINE / "executor" / "turn.py", "Turn").body
    fields = [n for n in body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]
    return ({n.target.id for n in fields},  # type: ignore[union-attr]
            {n.target.id for n in fields if ast.unparse(n.annotation).startswith("list")})  # type: ignore[union-attr]


def _targets(node: ast.AST) -> list[ast.expr]:
    """What an assignment or a del writes, tuples unpacked, subscripts to what they index."""
    if isinstance(node, (ast.Assign, ast.Delete)):
        raw = list(node.targets)
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        raw = [node.target]
    else:
        return []
    out: list[ast.expr] = []
    while raw:
        target = raw.pop()
        if isinstance(target, (ast.Tuple, ast.List)):
            raw.extend(target.elts)
        elif isinstance(target, ast.Starred):
            raw.append(target.value)
        elif isinstance(target, ast.Subscript):
            raw.append(target.value)
        else:
            out.append(target)
    return out


def _not_self(node: ast.expr) -> bool:
    return not (isinstance(node, ast.Name) and node.id == "self")


def _writes(path: Path, names: set[str], lists: set[str]) -> list[str]:
    found = []
    label = path.relative_to(SERVICE) if path.is_relative_to(SERVICE) else path.name
    for node in ast.walk(ast.parse(path.read_text())):
        for target in _targets(node):
            if isinstance(target, ast.Attribute) and target.attr in names and _not_self(target.value):
                found.append(f"{label}:{node.lineno}: {ast.unparse(target)}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
            owner = node.func.value
            if isinstance(owner, ast.Attribute) and owner.attr in lists and _not_self(owner.value):
                found.append(f"{label}:{node.lineno}: {ast.unparse(node.func)}()")
    return found


def test_the_attribute_names_are_found() -> None:
    names, lists = _sample_attributes()
    assert {"slot", "pending", "next_token", "draft", "turn", "sampler", "session"} <= names
    assert {"pending", "draft"} <= lists
    fields, turn_lists = _turn_fields()
    assert {"completion_tokens", "t_first_token", "num_drafted", "cached_tokens"} <= fields
    assert {"held_ids", "held_logprobs"} <= turn_lists


def test_only_sample_py_writes_a_sample() -> None:
    names, lists = _sample_attributes()
    turn_names, turn_lists = _turn_fields()
    problems = []
    for path in sorted(ENGINE.rglob("*.py")):
        if path == ENGINE / "executor" / "sample.py":
            continue
        problems += _writes(path, names, lists)
        if path != ENGINE / "executor" / "turn.py":
            problems += _writes(path, turn_names, turn_lists)
    assert not problems, "Sample/Turn attributes written outside sample.py (turn.py):\n" + "\n".join(problems)


def test_no_other_wing_holds_samples() -> None:
    """What makes walking engine/ enough: no module outside it imports sample.py or turn.py."""
    for path in sorted(SERVICE.rglob("*.py")):
        if path.is_relative_to(ENGINE):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not node.module.endswith(("engine.sample", "engine.turn")), f"{path} imports {node.module}"
            if isinstance(node, ast.Import):
                assert not any(a.name.endswith(("engine.sample", "engine.turn")) for a in node.names), path


def test_the_check_sees_writes() -> None:
    """The walker catches each form of write it claims to (and leaves `self`'s own alone)."""
    import tempfile

    source = ("def f(s, self):\n    s.slot = None\n    s.turn.completion_tokens += 1\n    del s.pending[:2]\n"
              "    logits, s.ready_logits = s.ready_logits, None\n    s.pending[:0] = [1]\n    s.draft.clear()\n"
              "    s.turn.held_ids.append(1)\n    self.slot = None\n    s.slot.append([1])\n")
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "probe.py"
        path.write_text(source)
        writes = _writes(path, {"slot", "pending", "ready_logits", "draft", "turn"}, {"pending", "draft"})
        writes += _writes(path, {"completion_tokens", "held_ids"}, {"held_ids"})
    lines = sorted(int(w.split(":")[1]) for w in writes)
    assert lines == [2, 3, 4, 5, 6, 7, 8], writes
