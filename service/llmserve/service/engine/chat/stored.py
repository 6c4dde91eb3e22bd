"""Stored conversations: what a turn that asked to be kept (`store`) said and answered, so a
later turn can continue it by id instead of sending it again (the Responses API's
`previous_response_id`).

A continued turn renders the stored messages followed by its own; the executor's prefix
cache finds the conversation's KV in the slot that ran it while that slot is idle and not
reused, so only the new input is prefilled. The store is the process's memory, bounded by
count (MAX_STORED), by bytes (MAX_BYTES, the messages' and records' text) and by age
(MAX_AGE_S): the oldest go first, and a lookup of one too old finds nothing. With a
directory (`--session-dir`'s `responses/`) each entry is also a JSON file, written (fsynced)
by one writer thread off the event loop right after it is stored, and read back at
start-up; `close` waits for the writes, so a clean restart loses no stored turn; with --store-kv a continuation
after a restart starts from the turn's saved KV (engine/stored_kv.py). Each entry belongs to the key that stored it
(`owner`: a digest of the caller's credentials) and is found only with that key. Event loop
only.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import structlog

from ...domain.events import ToolCall
from ..session_file import write_atomically
from .chat import ChatMessage, Conversation

log = structlog.get_logger("llmserve.engine.stored")

MAX_STORED = 1024
MAX_BYTES = 64 << 20
MAX_AGE_S = 24 * 3600.0
SIZE_OVERHEAD = 1024  # bytes an entry counts beyond its text (the record's fields, ids)


def continued(stored: StoredConversation, messages: Sequence[ChatMessage], num_leading: int) -> list[ChatMessage]:
    """A turn that continues a stored conversation: its first `num_leading` messages (its
    instructions), the stored conversation, then the rest of its own."""
    return [*messages[:num_leading], *stored.messages, *messages[num_leading:]]


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
    from_disk: bool = False  # read at start-up: stored by an earlier process, whose slots are gone

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
                                      float(saved["stored_at"]), int(saved["size"]), from_disk=True)


class ConversationStore:
    def __init__(self, max_stored: int = MAX_STORED, max_bytes: int = MAX_BYTES, max_age_s: float = MAX_AGE_S,
                 directory: Path | None = None) -> None:
        """`directory`: where entries are kept across restarts (None: memory only)."""
        self.max_stored, self.max_bytes, self.max_age_s = max_stored, max_bytes, max_age_s
        self._entries: OrderedDict[str, StoredConversation] = OrderedDict()
        self.num_bytes = 0
        self._directory = directory
        self._disk: ThreadPoolExecutor | None = None  # one writer: a file's writes and removal stay in order
        if directory is not None:
            try:
                directory.mkdir(parents=True, exist_ok=True)
                self._load(directory)
                self._disk = ThreadPoolExecutor(1, thread_name_prefix="llmserve-stored-responses")
            except OSError as exc:  # a directory that fails: memory only, as without one
                log.warning("stored_responses_dir_unusable", path=str(directory), error=str(exc))

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
        # the messages' text twice (the record and the items repeat it), and a little for the rest;
        # counted, not serialized: a long conversation is encoded on the writer thread only
        size = 2 * sum(len(m.content) + sum(len(c.arguments) for c in m.tool_calls) for m in messages) + SIZE_OVERHEAD
        if key in self._entries:
            self._drop(key)
        entry = StoredConversation(owner, messages, record, items, time.time(), size)
        if self._disk is not None:
            self._disk.submit(_quietly, self._write, key, entry)
        self._add(key, entry)

    def _add(self, key: str, entry: StoredConversation) -> None:
        self._entries[key] = entry
        self.num_bytes += entry.size
        while self._entries and (len(self._entries) > self.max_stored or self.num_bytes > self.max_bytes):
            self._drop(next(iter(self._entries)))

    def _write(self, key: str, entry: StoredConversation) -> None:
        write_atomically(self._path(key), entry.as_json(key).encode())

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
        if self._disk is not None:
            self._disk.submit(_quietly, self._path(key).unlink, True)  # missing_ok

    def close(self) -> None:
        """Wait for the files still being written (a clean stop loses no stored turn)."""
        if self._disk is not None:
            self._disk.shutdown(wait=True)

    def __len__(self) -> int:
        return len(self._entries)


def _quietly(operation: Callable[..., object], *args: object) -> None:
    try:
        operation(*args)
    except OSError as exc:  # kept in memory still: lost at a restart only
        log.warning("stored_response_file_failed", operation=getattr(operation, "__name__", "?"), error=str(exc))


def kept_turn(store: ConversationStore, conversation: Conversation, owner: str, model: str) -> str:
    """A chat session's conversation, to its last reply, stored under a new id (gRPC's
    `SessionConfig.store`, a surface with no response object of its own): the record is the
    Responses API's minimum, so `GET /v1/responses/{id}` answers it too. The messages as a
    named session keeps them: role and text (an assistant's calls as the text it wrote)."""
    messages = tuple(ChatMessage(role, content) for role, content in conversation.saved() or ())
    key = f"resp_{uuid.uuid4().hex}"
    reply = messages[-1].content if messages and messages[-1].role == "assistant" else ""
    message = {"type": "message", "id": f"msg_{key}", "status": "completed", "role": "assistant",
               "content": [{"type": "output_text", "text": reply, "annotations": [], "logprobs": []}]}
    record: dict[str, object] = {"id": key, "object": "response", "created_at": int(time.time()), "status": "completed",
                                 "error": None, "model": model, "output": [message], "store": True}
    store.put(key, owner, messages, record, ())
    return key
