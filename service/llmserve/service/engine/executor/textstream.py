"""Incremental detokenization with stop strings (pure).

Token pieces arrive as raw bytes, one token at a time. `TextStream` emits only
text that is safe to show: incomplete UTF-8 sequences are held back until their
last byte arrives, and so is any tail that could be the start of a stop string,
so a stop string is never streamed, even when it is split across tokens.
"""

from __future__ import annotations

import codecs


class TextStream:
    def __init__(self, stop: tuple[str, ...] = ()) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.stop = tuple(s for s in stop if s)
        self._stop = self.stop
        self._max_hold = max((len(s) for s in self._stop), default=1) - 1
        self._pending = ""

    def push(self, piece: bytes) -> tuple[str, str | None]:
        """Add one token's bytes; returns (text to emit now, matched stop string or None).

        On a match the returned text is everything before the stop string and the
        stream is finished.
        """
        self._pending += self._decoder.decode(piece)
        if not self._stop:
            text, self._pending = self._pending, ""
            return text, None
        match = self._earliest_stop()
        if match is not None:
            at, stop = match
            text, self._pending = self._pending[:at], ""
            return text, stop
        hold = self._partial_stop_length()
        cut = len(self._pending) - hold
        text, self._pending = self._pending[:cut], self._pending[cut:]
        return text, None

    def flush(self) -> str:
        """The turn ended for another reason: whatever is held back is final text."""
        text = self._pending + self._decoder.decode(b"", final=True)
        self._pending = ""
        return text

    def _earliest_stop(self) -> tuple[int, str] | None:
        found = [(self._pending.find(s), s) for s in self._stop]
        found = [(at, s) for at, s in found if at >= 0]
        return min(found) if found else None

    def _partial_stop_length(self) -> int:
        for k in range(min(len(self._pending), self._max_hold), 0, -1):
            tail = self._pending[-k:]
            if any(s.startswith(tail) for s in self._stop):
                return k
        return 0
