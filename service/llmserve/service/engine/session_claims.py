"""Named sessions on this server's streams: one stream at a time per session id.

The policy every surface that takes a `session_id` keeps, on the event loop: a second
stream that opens an id while one has it gets `PreconditionFailed` with a retry hint;
without --session-dir a named session is refused. Across servers that share the
directory the store's lock (session_store.py) keeps the same rule.
"""

from __future__ import annotations

import asyncio

from ..domain.errors import Field, PreconditionFailed
from ..domain.snapshots import SavedSession
from .session_store import SessionStore


class SessionClaims:
    def __init__(self, store: SessionStore | None) -> None:
        self._store = store
        self._in_use: set[str] = set()

    async def claim(self, session_id: str) -> SavedSession | None:
        """Hold `session_id` (none: nothing) for one stream until `release`, and its saved
        state, if any, read off the loop (StorageFault when the directory fails)."""
        if not session_id:
            return None
        if self._store is None:
            raise PreconditionFailed("named sessions need the server to run with --session-dir", field=Field.SESSION_ID)
        if session_id in self._in_use:
            raise PreconditionFailed(f"session {session_id!r} is open on another stream; retry",
                                     field=Field.SESSION_ID, retry_after_s=1.0)
        self._in_use.add(session_id)
        try:
            return await asyncio.to_thread(self._store.load, session_id)
        except BaseException:
            self._in_use.discard(session_id)
            raise

    def release(self, session_id: str) -> None:
        """The stream that claimed `session_id` ended."""
        self._in_use.discard(session_id)
