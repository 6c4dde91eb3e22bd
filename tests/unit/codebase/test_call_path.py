"""docs/architecture.md lists the named types one call touches as the code has them
(tools/call_path reads the service with ast), and the walk follows what it says it follows:
a change in a call's path changes the tool's list, so the doc's check fails until
`python -m tools.call_path --write-doc` is run."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tools.call_path.doc import DOC, ROOTS, doc_section, section
from tools.call_path.entries import chat_root, generate_root, walk_call
from tools.call_path.index import Index


@pytest.mark.parametrize("call", sorted(ROOTS))
def test_the_docs_list_is_the_tools(call: str) -> None:
    assert doc_section(call, DOC) == section(call), (
        f"the {call} call's path changed: run `python -m tools.call_path --write-doc` and read the diff")


# A small service with the shape the tool expects: a servicer with Generate, an HTTP route,
# an executor whose thread runs the step loop, a protocol and its implementer.
FILES = {
    "domain/events.py": """
        from typing import Protocol
        class Sink(Protocol):
            def put(self, event: object) -> None: ...
        class Token:
            def __init__(self, text: str) -> None:
                self.text = text
        class Failed:
            pass
    """,
    "engine/commands.py": """
        from dataclasses import dataclass
        @dataclass(frozen=True)
        class Open:
            key: int
        @dataclass(frozen=True)
        class Embed:
            key: int
    """,
    "engine/sink.py": """
        class QueueSink:
            def put(self, event: object) -> None:
                self.last = event
    """,
    "engine/table.py": """
        from ..domain.events import Sink, Token
        class Row:
            pass
        class Table:
            def __init__(self) -> None:
                self.rows: dict[int, Row] = {}
            def step(self, sink: Sink) -> None:
                for row in self.rows.values():
                    row.name
                sink.put(Token("x"))
    """,
    "engine/executor.py": """
        import threading
        from .commands import Embed, Open
        from .table import Table
        class Oops(Exception):
            pass
        class EmbedQueue:
            def add(self) -> None: ...
        class Executor:
            def __init__(self) -> None:
                self.table = Table()
                self._thread = threading.Thread(target=self._run)
            def open(self, key: int) -> None:
                self.queue.put(Open(key))
            def _run(self) -> None:
                command: object = self.queue.get()
                if isinstance(command, Embed):
                    EmbedQueue().add()
                elif isinstance(command, Open):
                    command.key
                self.step()
            def step(self) -> None:
                if self.broken:
                    raise Oops()
                self.table.step(self.sink)
    """,
    "engine/engine.py": """
        from .executor import Executor
        from .sink import QueueSink
        class Engine:
            def __init__(self) -> None:
                self._executor = Executor()
            def open(self) -> QueueSink:
                self._executor.open(1)
                return QueueSink()
    """,
    "transport/servicer.py": """
        from ..engine.engine import Engine
        class Servicer:
            def __init__(self, engine: Engine) -> None:
                self.engine = engine
            async def Generate(self, requests, context):
                sink = self.engine.open()
                yield sink.last
    """,
    "http/surface.py": """
        from ..engine.engine import Engine
        class Surface:
            def start(self, app) -> None:
                app.router.add_post("/v1/chat/completions", self._chat)
            async def _chat(self, request) -> None:
                self.engine.open()
                self.engine: Engine
    """,
}


def _service(root: Path, files: dict[str, str]) -> Index:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
        for parent in path.relative_to(root).parents:
            (root / parent / "__init__.py").touch()
    return Index(root)


def _names(index: Index, touched: dict[str, set[str]]) -> set[str]:
    return {q.rsplit(".", 1)[1] for q in touched}


def test_the_walk_follows_both_sides_of_a_call(tmp_path: Path) -> None:
    index = _service(tmp_path, FILES)
    path = walk_call(index, "generate", generate_root(index), set(), set())
    assert _names(index, path.loop.touched) == {"Servicer", "Engine", "Executor", "Open", "QueueSink"}
    # the step loop: the command the call made (Open), not the one it never makes (Embed), nor the
    # exception of a failure; the protocol goes to the implementer the call constructs
    assert _names(index, path.executor.touched) == {"Executor", "Open", "Table", "Row", "Token", "Sink", "QueueSink"}
    assert path.total == 9
    everything = walk_call(index, "generate", generate_root(index), set(), set(), plain=False)
    assert {"EmbedQueue", "Oops"} <= _names(index, everything.executor.touched)  # every branch, failures too
    assert "Embed" not in _names(index, everything.executor.touched)  # named in isinstance only: a test, not a use
    pruned = walk_call(index, "generate", generate_root(index), {"Row", "Table.step"}, {"Row", "Table.step"})
    assert not {"Row", "Token", "Sink"} & _names(index, pruned.executor.touched)


def test_a_changed_path_changes_the_list(tmp_path: Path) -> None:
    before = _service(tmp_path / "before", FILES)
    changed = dict(FILES)
    changed["engine/table.py"] = FILES["engine/table.py"].replace('sink.put(Token("x"))', 'sink.put(Token("x"))\n'
                                                                  '                Row()')
    changed["engine/table.py"] += "\n        class Extra:\n            pass\n"
    changed["engine/engine.py"] = FILES["engine/engine.py"].replace("return QueueSink()", "Extra()\n"
                                                                    "                return QueueSink()").replace(
        "from .sink import QueueSink", "from .sink import QueueSink\n        from .table import Extra")
    after = _service(tmp_path / "after", changed)
    old = walk_call(before, "generate", generate_root(before), set(), set())
    new = walk_call(after, "generate", generate_root(after), set(), set())
    assert _names(after, new.loop.touched) - _names(before, old.loop.touched) == {"Extra"}
    assert new.total == old.total + 1


def test_the_chat_route_is_found_by_its_path(tmp_path: Path) -> None:
    index = _service(tmp_path, FILES)
    module, cls, func = chat_root(index)
    assert (module.path, cls.name if cls else None, func.name) == ("http/surface.py", "Surface", "_chat")
    path = walk_call(index, "chat", (module, cls, func), set(), set())
    assert {"Surface", "Engine", "Open"} <= _names(index, path.loop.touched)


def test_a_pruned_name_that_is_gone_fails(tmp_path: Path) -> None:
    index = _service(tmp_path, FILES)
    with pytest.raises(LookupError, match="NoSuchThing"):
        walk_call(index, "generate", generate_root(index), {"NoSuchThing"}, set())
