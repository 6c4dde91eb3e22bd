"""The call paths as text: the tool's report and docs/architecture.md's generated sections."""

from __future__ import annotations

from itertools import groupby
from pathlib import Path

from .entries import CallPath, Root, chat_root, generate_root, walk_call
from .index import ROOT, ClassInfo, Index
from .plain import CALLS, DESCRIPTIONS, FEATURES, pruned
from .walk import Side

DOC = ROOT / "docs" / "architecture.md"
LEFT_OUT = ("marker", "protocol", "exception")  # the second count leaves these kinds out
ROOTS = {"generate": generate_root, "chat": chat_root}


def call_path(call: str, index: Index | None = None, plain: bool = True) -> CallPath:
    index = index or Index()
    root: Root = ROOTS[call](index)
    names = pruned(call) if plain else set()
    return walk_call(index, call, root, names, names, plain)


def counts(path: CallPath) -> tuple[int, int, int, int]:
    """(loop, executor, distinct, distinct leaving out markers, protocols and exceptions)."""
    both = [c for c in path.index.all_classes if c.qualname in set(path.loop.touched) | set(path.executor.touched)]
    core = [c for c in both if path.index.kind(c) not in LEFT_OUT]
    return len(path.loop.touched), len(path.executor.touched), len(both), len(core)


def _side_lines(path: CallPath, side: Side) -> list[str]:
    lines = []
    for file, classes in groupby(path.classes(side), key=lambda c: c.path):
        names = ", ".join(_named(path.index, c) for c in classes)
        lines.append(f"- `{file}`: {names}")
    return lines


def _named(index: Index, cls: ClassInfo) -> str:
    kind = index.kind(cls)
    return f"`{cls.name}`" if kind == "class" else f"`{cls.name}` ({kind})"


def section(call: str, index: Index | None = None) -> str:
    """The generated text between `<!-- call-path:CALL -->` and `<!-- /call-path:CALL -->`."""
    index = index or Index()
    path = call_path(call, index)
    everything = call_path(call, index, plain=False)
    loop, executor, total, core = counts(path)
    shared = len(set(path.loop.touched) & set(path.executor.touched))
    off = [f"- {name}: {FEATURES[name][0]}" for name in CALLS[call]]
    lines = [
        f"**{total} named types** for {DESCRIPTIONS[call]} ({core} leaving out markers, protocols and "
        f"exceptions): {loop} on the event loop, {executor} on the executor thread, {shared} on both. "
        f"Read with every branch and feature: {counts(everything)[2]}.",
        "",
        "Left out, as a plain call does not use them (`tools/call_path/plain.py`):",
        "",
        *off,
        "",
        f"On the event loop ({loop}), from {path.loop.root}:",
        "",
        *_side_lines(path, path.loop),
        "",
        f"On the executor thread ({executor}), from {path.executor.root} (its step loop, which handles "
        "the commands the call queues):",
        "",
        *_side_lines(path, path.executor),
    ]
    return "\n".join(lines)


def report(call: str, plain: bool = True, why: str | None = None) -> str:
    """The tool's output: the types per side, with counts (and, with `why`, who touches a class)."""
    path = call_path(call, plain=plain)
    loop, executor, total, core = counts(path)
    mode = "plain (tools/call_path/plain.py)" if plain else "every branch and feature"
    lines = [f"{call}: {total} named types, {mode}; {core} leaving out markers, protocols and exceptions"]
    for side, count in ((path.loop, loop), (path.executor, executor)):
        lines.append(f"\n{side.name} ({count}), from {side.root}:")
        for cls in path.classes(side):
            lines.append(f"  {cls.path:32} {cls.name:24} {path.index.kind(cls):10} {' '.join(sorted(side.touched[cls.qualname]))}")
            if why and cls.name == why:
                lines.extend(f"      touched in {where}" for where in sorted(side.where[cls.qualname]))
    return "\n".join(lines)


def markers(call: str) -> tuple[str, str]:
    return f"<!-- call-path:{call} -->", f"<!-- /call-path:{call} -->"


def doc_section(call: str, doc: Path = DOC) -> str:
    text = doc.read_text()
    start, end = markers(call)
    if start not in text or end not in text:
        raise LookupError(f"{doc.name} has no {start} ... {end} section")
    return text[text.index(start) + len(start): text.index(end)].strip("\n")


def write_doc(doc: Path = DOC) -> list[str]:
    """Regenerate every call-path section of the doc; the calls whose section changed."""
    text, changed = doc.read_text(), []
    index = Index()
    for call in ROOTS:
        start, end = markers(call)
        new = section(call, index)
        if doc_section(call, doc) != new:
            changed.append(call)
        text = text[: text.index(start) + len(start)] + "\n" + new + "\n" + text[text.index(end):]
    doc.write_text(text)
    return changed
