"""Stored conversations: what a turn that asked to be kept (`store`) said and answered, so a
later turn can continue it by id instead of sending it again (the Responses API's
`previous_response_id`).

A continued turn renders the stored messages followed by its own; the executor's prefix
cache finds the conversation's KV in the slot that ran it while that slot is idle and not
reused, so only the new input is prefilled. The store is the process's memory, bounded by
count (MAX_STORED), by bytes (MAX_BYTES, the messages' and records' text) and by age
(MAX_AGE_S): the oldest go first, and a lookup of one too old finds nothing. Each entry
belongs to the key that stored it (`owner`: a digest of the caller's credentials) and is
found only with that key. Event loop only.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict
from dataclasses import dataclass

from .chat import ChatMessage

MAX_STORED = 1024
MAX_BYTES = 64 << 20
MAX_AGE_S = 24 * 3600.0


def owner_of(credentials: str) -> str:
    """The owner id of a caller presenting `credentials` (its API key, or "" without one)."""
    return hashlib.sha256(credentials.encode("utf-8", "surrogateescape")).hexdigest()


@dataclass(frozen=True)
class StoredConversation:
    """`messages`: the conversation so far, the stored turn's reply last; `record`: what the
    surface answers when asked for it again (its response object); `items`: the turn's input
    as the surface lists it."""

    owner: str
    messages: tuple[ChatMessage, ...]
    record: dict[str, object]
    items: tuple[dict[str, object], ...]
    stored_at: float
    size: int


class ConversationStore:
    def __init__(self, max_stored: int = MAX_STORED, max_bytes: int = MAX_BYTES, max_age_s: float = MAX_AGE_S) -> None:
        self.max_stored, self.max_bytes, self.max_age_s = max_stored, max_bytes, max_age_s
        self._entries: OrderedDict[str, StoredConversation] = OrderedDict()
        self.num_bytes = 0

    def put(self, key: str, owner: str, messages: tuple[ChatMessage, ...], record: dict[str, object],
            items: tuple[dict[str, object], ...]) -> None:
        size = sum(len(m.content) + sum(len(c.arguments) for c in m.tool_calls) for m in messages)
        size += len(json.dumps(record)) + len(json.dumps(items))
        self.delete(key, owner)
        self._entries[key] = StoredConversation(owner, messages, record, items, time.monotonic(), size)
        self.num_bytes += size
        while self._entries and (len(self._entries) > self.max_stored or self.num_bytes > self.max_bytes):
            self._drop(next(iter(self._entries)))

    def get(self, key: str, owner: str) -> StoredConversation | None:
        """The entry, if `owner` stored it and it is not too old."""
        entry = self._entries.get(key)
        if entry is not None and time.monotonic() - entry.stored_at > self.max_age_s:
            self._drop(key)
            return None
        return entry if entry is not None and entry.owner == owner else None

    def delete(self, key: str, owner: str) -> bool:
        if self.get(key, owner) is None:
            return False
        self._drop(key)
        return True

    def _drop(self, key: str) -> None:
        self.num_bytes -= self._entries.pop(key).size

    def __len__(self) -> int:
        return len(self._entries)
