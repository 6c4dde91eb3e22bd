"""The KV of stored turns, with --session-dir and --store-kv: a turn stored to be continued by id
(the Responses API's `store`) runs as a session saved under `session_id(key)` when it ends, as
a named session is (session_store.py: the writer thread, the directory's byte bound and its
LRU eviction); a turn that continues it after a restart starts from that state
(`Engine.call`'s `prefix`; `continued` says when). The state is written once and never
changed, so any number of calls may start from it at once (`SessionStore.read`, no claim). Off
by default: the save copies the turn's whole KV on the executor thread as it ends (every turn
of a long conversation again), which a server whose clients rarely continue after a restart
should not pay. Without it a continuation prefills what no slot holds.
"""

from __future__ import annotations

import asyncio

import structlog

from ..domain.errors import PreconditionFailed, StorageFault
from ..domain.request_rules import SERVER_SESSION_PREFIX
from ..domain.snapshots import SavedSession
from .chat.stored import StoredConversation
from .session_store import SessionStore

log = structlog.get_logger("llmserve.engine.stored")

MAX_WAIT_S = 2.0  # for the stored turn's own save, still being written when the continuation comes


class StoredKV:
    def __init__(self, store: SessionStore | None, save: bool) -> None:
        """`save`: stored turns' KV is saved (--store-kv); what an earlier process saved is read either way."""
        self._store = store
        self._save = save and store is not None

    def session_id(self, key: str) -> str:
        """The session id a stored turn's KV is saved under ("": not saved)."""
        return _file_id(key) if self._save else ""

    async def continued(self, key: str, stored: StoredConversation) -> SavedSession | None:
        """The KV a turn continuing the stored turn `key` starts from: its saved state when an
        earlier process stored it (read off the loop), else None. One this process stored is
        found in the slot that ran it, unless other calls took it: then prefilled, as reading
        its file (and waiting for its write) made every continuation slower (bench.continued)."""
        return await self.read(key) if stored.from_disk else None

    async def read(self, key: str) -> SavedSession | None:
        """The saved KV of the stored turn `key`, read off the loop; None when there is none
        (never saved, evicted, made with another model, or the directory fails: the
        continuation then prefills it)."""
        if self._store is None:
            return None
        try:
            return await asyncio.to_thread(self._store.read, _file_id(key), MAX_WAIT_S)
        except (PreconditionFailed, StorageFault) as exc:
            log.info("stored_turn_kv_unread", key=key, reason=str(exc))
            return None

    async def discard(self, key: str) -> None:
        """The stored turn was deleted: its KV goes too."""
        if self._store is not None:
            await asyncio.to_thread(self._store.discard, _file_id(key))


def _file_id(key: str) -> str:
    return f"{SERVER_SESSION_PREFIX}{key}"
