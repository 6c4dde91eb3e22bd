"""Stored conversations: what a turn that asked to be kept (`store`) said and answered, so a
later turn can continue it by id instead of sending it again (the Responses API's
`previous_response_id`).

A continued turn renders the stored messages followed by its own; the executor's prefix
cache finds the conversation's KV in the slot that ran it while that slot is idle and not
reused, so only the new input is prefilled. The store is the process's memory, bounded by
count (MAX_STORED), by bytes (MAX_BYTES, the messages' and records' text) and by age
(MAX_AGE_S): the oldest go first, and a lookup of one too old finds nothing. With a
directory (`--session-dir`'s `responses/`) each entry is also a JSON file, written when
stored (a few kilobytes: on the loop, as a log line is) and read back at start-up, so a
restart loses no stored turn; a continuation after a restart prefills the conversation
again (the KV went with the process). Each entry belongs to the key that stored it
(`owner`: a digest of the caller's credentials) and is found only with that key. Event loop
only.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import structlog

from ...domain.events import ToolCall
from .chat import ChatMessage

log = structlog.get_logger("llmserve.engine.stored")

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
    stored_at: float  # time.time()
    size: int

    def as_json(self, key: str) -> str:
        messages = [{"role": m.role, "content": m.content, "tool_call_id": m.tool_call_id,
                     "tool_calls": [[c.id, c.name, c.arguments] for c in m.tool_calls]} for m in self.messages]
        return json.dumps({"key": key, "owner": self.owner, "messages": messages, "record": self.record, "items": self.items,
                           "stored_at": self.stored_at, "size": self.size})

    @classmethod
    def of_json(cls, text: str) -> tuple[str, StoredConversation]:
        saved = json.loads(text)
        messages = tuple(ChatMessage(m["role"], m["content"], tuple(ToolCall(*c) for c in m["tool_calls"]),
                                     m["tool_call_id"]) for m in saved["messages"])
        return str(saved["key"]), cls(saved["owner"], messages, saved["record"], tuple(saved["items"]),
                                      float(saved["stored_at"]), int(saved["size"]))


class ConversationStore:
    def __init__(self, max_stored: int = MAX_STORED, max_bytes: int = MAX_BYTES, max_age_s: float = MAX_AGE_S,
                 directory: Path | None = None) -> None:
        """`directory`: where entries are kept across restarts (None: memory only)."""
        self.max_stored, self.max_bytes, self.max_age_s = max_stored, max_bytes, max_age_s
        self._entries: OrderedDict[str, StoredConversation] = OrderedDict()
        self.num_bytes = 0
        self._directory = directory
        if directory is not None:
            try:
                directory.mkdir(parents=True, exist_ok=True)
                self._load(directory)
            except OSError as exc:  # a directory that fails: memory only, as without one
                log.warning("stored_responses_dir_unusable", path=str(directory), error=str(exc))
                self._directory = None

    def _load(self, directory: Path) -> None:
        """The entries kept there, oldest first, within the bounds (the rest deleted)."""
        loaded = []
        for path in directory.glob("*.json"):
            try:
                loaded.append(StoredConversation.of_json(path.read_text()))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("stored_response_unreadable", path=str(path), error=str(exc))
                path.unlink(missing_ok=True)
        for key, entry in sorted(loaded, key=lambda pair: pair[1].stored_at):
            self._add(key, entry)

    def put(self, key: str, owner: str, messages: tuple[ChatMessage, ...], record: dict[str, object],
            items: tuple[dict[str, object], ...]) -> None:
        size = sum(len(m.content) + sum(len(c.arguments) for c in m.tool_calls) for m in messages)
        size += len(json.dumps(record)) + len(json.dumps(items))
        self.delete(key, owner)
        entry = StoredConversation(owner, messages, record, items, time.time(), size)
        if self._directory is not None:
            try:
                path = self._path(key)  # a digest of the key: the key is the client's x-request-id in part
                partial = path.with_suffix(f".{os.getpid()}.tmp")
                partial.write_text(entry.as_json(key))
                partial.replace(path)
            except OSError as exc:  # kept in memory still: lost at a restart only
                log.warning("stored_response_not_written", key=key, error=str(exc))
        self._add(key, entry)

    def _add(self, key: str, entry: StoredConversation) -> None:
        self._entries[key] = entry
        self.num_bytes += entry.size
        while self._entries and (len(self._entries) > self.max_stored or self.num_bytes > self.max_bytes):
            self._drop(next(iter(self._entries)))

    def _path(self, key: str) -> Path:
        assert self._directory is not None
        return self._directory / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"

    def get(self, key: str, owner: str) -> StoredConversation | None:
        """The entry, if `owner` stored it and it is not too old."""
        entry = self._entries.get(key)
        if entry is not None and time.time() - entry.stored_at > self.max_age_s:
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
        if self._directory is not None:
            self._path(key).unlink(missing_ok=True)

    def __len__(self) -> int:
        return len(self._entries)
