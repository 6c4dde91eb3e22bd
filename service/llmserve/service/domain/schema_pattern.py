"""Whether the converter's translation of a schema `pattern` can write a character that a
JSON string must escape (`"`, `\\`, or a control character below U+0020).

The converter copies a pattern into the grammar of the string's raw text: `.` becomes any
character but a line break, `[^a]` any character but `a`, a `"` in the pattern a raw
quote. Such a character written raw ends the string early or breaks the JSON, so the
reply may not parse; a `strict` schema refuses the pattern (domain/schema_strict.py).
"""

from __future__ import annotations

import re

_UNSAFE = ('"', "\\")
_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "f": "\f", "v": "\v", "0": "\0"}


def unsafe_piece(pattern: str) -> str | None:
    """The first piece of `pattern` whose translation can write `"`, `\\` or a control
    character raw (None when there is none)."""
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            width = {"x": 4, "u": 6}.get(pattern[i + 1:i + 2], 2)
            value, piece, i = _escaped(pattern, i), pattern[i:i + width], i + width
            if value is not None and _unsafe(value, value):
                return piece
        elif char == "[":
            end = _class_end(pattern, i)
            body = pattern[i + 1:end]
            if body.startswith("^") or any(_unsafe(low, high) for low, high in _ranges(body)):
                return pattern[i:end + 1]
            i = end + 1
        elif char == "." or _unsafe(char, char):
            return char
        else:
            i += 1
    return None


def _unsafe(low: str, high: str) -> bool:
    return ord(low) < 0x20 or any(low <= c <= high for c in _UNSAFE)


def _escaped(pattern: str, i: int) -> str | None:
    """The character `\\x` at `i` stands for (None for a class such as `\\d`: the grammar
    parser refuses those)."""
    code = pattern[i + 1:i + 2]
    if code in ("x", "u"):
        digits = pattern[i + 2:i + (4 if code == "x" else 6)]
        try:
            return chr(int(digits, 16))
        except ValueError:
            return None
    if code in _ESCAPES:
        return _ESCAPES[code]
    return None if code.isalnum() or not code else code


def _class_end(pattern: str, start: int) -> int:
    i = start + 1
    while i < len(pattern) and pattern[i] != "]":
        i += 2 if pattern[i] == "\\" else 1
    return min(i, len(pattern))


def _ranges(body: str) -> list[tuple[str, str]]:
    """A class's characters as (low, high) ranges; `\\x` escapes read as one character."""
    chars: list[tuple[str, bool]] = []  # (the character, whether it was escaped)
    i = 0
    while i < len(body):
        if body[i] == "\\":
            value = _escaped(body, i)
            chars.append((value if value is not None else "a", True))  # \d and the like: the parser refuses
            i += {"x": 4, "u": 6}.get(body[i + 1:i + 2], 2)
        else:
            chars.append((body[i], False))
            i += 1
    ranges, j = [], 0
    while j < len(chars):
        if j + 2 < len(chars) and chars[j + 1] == ("-", False):
            ranges.append((chars[j][0], chars[j + 2][0]))
            j += 3
        else:
            ranges.append((chars[j][0], chars[j][0]))
            j += 1
    return ranges


_QUANTIFIER = re.compile(r"\{(\d*)(?:(,)(\d*))?\}")


def empty_repeat(pattern: str) -> str | None:
    """The first repeated part of `pattern` (`*`, `+` or `{m,n}` with more than one
    repetition) that can itself match the empty string, such as `([a-z]{0,3}){0,20}` or
    `(a*)+` (None when there is none). Each way of splitting the text among the
    repetitions is a grammar stack of its own: measured on llama.cpp's grammar sampler,
    one step over the vocabulary took 1.1 s for `([a-z]{0,2}){0,12}` and over 60 s for
    `([a-z]{0,3}){0,20}`, on the executor thread, for everyone. Without the empty match
    (`([a-z]{1,3}){0,20}`) the same language costs what a plain string does."""
    return _Nullable(pattern).alternation(0)[1]


class _Nullable:
    """A recursive descent over a pattern as the converter reads it (groups, classes,
    escapes, quantifiers), noting whether each part can match the empty string."""

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern.removeprefix("^").removesuffix("$")

    def alternation(self, i: int) -> tuple[int, str | None, bool]:
        """(the index after it, the first empty repeat in it, whether it can match empty)."""
        nullable = False
        while True:
            i, found, branch_nullable = self.sequence(i)
            nullable = nullable or branch_nullable
            if found or i >= len(self.pattern) or self.pattern[i] != "|":
                return i, found, nullable
            i += 1

    def sequence(self, i: int) -> tuple[int, str | None, bool]:
        nullable = True
        while i < len(self.pattern) and self.pattern[i] not in "|)":
            start = i
            i, found, atom_nullable = self.atom(i)
            if found:
                return i, found, False
            while i < len(self.pattern):
                repeats, i_after, may_skip = self._quantifier(i)
                if i_after == i:
                    break
                if repeats and atom_nullable:
                    return i_after, self.pattern[start:i_after], False
                atom_nullable, i = atom_nullable or may_skip, i_after
            nullable = nullable and atom_nullable
        return i, None, nullable

    def atom(self, i: int) -> tuple[int, str | None, bool]:
        char = self.pattern[i]
        if char == "(":
            i, found, nullable = self.alternation(i + 1)
            return min(i + 1, len(self.pattern)), found, nullable
        if char == "[":
            return _class_end(self.pattern, i) + 1, None, False
        if char == "\\":
            return i + {"x": 4, "u": 6}.get(self.pattern[i + 1:i + 2], 2), None, self.pattern[i + 1:i + 2] in ("b", "B")
        return i + 1, None, char in "^$"

    def _quantifier(self, i: int) -> tuple[bool, int, bool]:
        """(whether it repeats the atom more than once, the index after it, whether it may
        skip the atom); the index is `i` when no quantifier is there."""
        char = self.pattern[i]
        if char in "*+?":
            return char != "?", i + 1, char != "+"
        match = _QUANTIFIER.match(self.pattern, i) if char == "{" else None
        if match is None:
            return False, i, False
        low = int(match.group(1) or 0)
        high = match.group(3) if match.group(2) else match.group(1)
        return not high or int(high) > 1, match.end(), low == 0
