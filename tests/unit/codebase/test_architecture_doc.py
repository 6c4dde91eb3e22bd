"""docs/architecture.md stays true to the code: the glossary's types are classes defined in
the files it names (read with ast, nothing imported). The types one call touches are
generated from the code and checked against it in test_call_path.py."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SERVICE = ROOT / "service" / "llmserve" / "service"
DOC = ROOT / "docs" / "architecture.md"
NAMED_TYPE = re.compile(r"`([a-z_/]+\.py)` `([A-Z]\w+)`")


def _block(name: str) -> str:
    text = DOC.read_text()
    return text[text.index(f"<!-- {name} -->") : text.index(f"<!-- /{name} -->")]


@cache
def _classes(relative: str) -> frozenset[str]:
    tree = ast.parse((SERVICE / relative).read_text())
    return frozenset(node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef))


def _missing(pairs: list[tuple[str, str]]) -> list[str]:
    return [f"{path} {name}" for path, name in pairs if not (SERVICE / path).exists() or name not in _classes(path)]


def test_every_glossary_word_names_a_real_type() -> None:
    rows = [line for line in _block("glossary").splitlines() if line.startswith("| ") and "`" in line]
    assert len(rows) >= 10
    pairs = []
    for row in rows:
        found = NAMED_TYPE.search(row.split("|")[2])
        assert found, f"no type in the glossary row {row!r}"
        pairs.append(found.groups())
    assert not _missing(pairs)


def test_a_wrong_name_is_caught() -> None:
    assert _missing([("engine/executor/session.py", "Session"), ("engine/executor/session.py", "Sample"), ("engine/nowhere.py", "X")]) == [
        "engine/executor/session.py Sample", "engine/nowhere.py X"]
