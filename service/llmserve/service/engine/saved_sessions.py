"""Saved sessions: KV state on disk, so a named session survives the stream and restarts.

File layout: MAGIC, sha256 of the rest, u32 header length, JSON header (session id,
tokens in the KV, pending tokens, chat messages, and the fingerprint of the model
and KV layout it was made with), then the bytes of `llama_state_seq_get_data`.
Writes are atomic (temporary file + rename) and happen on a writer thread; the
directory is kept under `max_bytes` by deleting the least recently used files. A
file that is corrupt or was made with another model or KV layout is discarded and
logged, never loaded, and so is one whose tokens do not fit this server's slots or
vocabulary.

A session id is saved at most once at a time and never read while a save of it is
on its way: `begin` (when a stream opens the id) counts a save to come, `settle`
(the executor had nothing to save) or the written file ends it, and `load` waits
for it. So a stream that reopens an id at once gets the state the last one left.

Servers may share the directory (replicas on one volume): `load` takes an flock on
`locks/<id>.lock` and holds it until the stream's save settles, so another server that
opens the id meanwhile gets FAILED_PRECONDITION with a retry hint instead of a stale
state, and two servers never write one session at once.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import struct
import tempfile
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import structlog

from ..domain import PreconditionFailed, SavedSession
from ..metrics import Metrics

log = structlog.get_logger("llmserve.sessions")

MAGIC = b"LLMSERVE-SESSION-1\n"
SUFFIX = ".session"


def model_fingerprint(model_path: Path, meta: Any, cache_type_k: str, cache_type_v: str) -> dict[str, object]:
    """What a saved state depends on: the model file and the KV layout."""
    with model_path.open("rb") as f:
        head = hashlib.sha256(f.read(1 << 20)).hexdigest()
    return {
        "model_bytes": model_path.stat().st_size,
        "model_head_sha256": head,
        "architecture": meta.architecture,
        "n_embd": meta.n_embd,
        "cache_type_k": cache_type_k,
        "cache_type_v": cache_type_v,
        "swa_full": True,
    }


class SessionStore:
    def __init__(
        self, directory: Path, max_bytes: int, fingerprint: dict[str, object], metrics: Metrics,
        max_tokens: int, n_vocab: int,
    ) -> None:
        """`max_tokens`, `n_vocab`: a saved session must fit one slot and the vocabulary."""
        self.max_tokens = max_tokens
        self.n_vocab = n_vocab
        self.directory = directory
        self.max_bytes = max_bytes
        self.fingerprint = fingerprint
        self.metrics = metrics
        directory.mkdir(parents=True, exist_ok=True)
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llmserve-session-writer")
        self._lock = threading.Lock()
        self._saves = threading.Condition()
        self._num_saving: dict[str, int] = {}  # session id -> saves to come
        self._claims: dict[str, tuple[int, int]] = {}  # session id -> (lock file fd, claims)
        (directory / "locks").mkdir(exist_ok=True)
        self._update_bytes()

    def _claim(self, session_id: str) -> None:
        """Hold the id's lock file (flock) until its stream's save settles, so servers that
        share the directory never use or write one session at once."""
        with self._lock:
            if session_id in self._claims:  # this server holds it already (a reopen)
                fd, count = self._claims[session_id]
                self._claims[session_id] = (fd, count + 1)
                return
            fd = os.open(self.directory / "locks" / self.path_for(session_id).with_suffix(".lock").name,
                         os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise PreconditionFailed(
                    f"session {session_id!r} is open on another server that shares --session-dir; retry",
                    field="config.session_id", retry_after_s=1.0,
                ) from None
            self._claims[session_id] = (fd, 1)

    def _release(self, session_id: str) -> None:
        with self._lock:
            fd, count = self._claims.get(session_id, (-1, 0))
            if count > 1:
                self._claims[session_id] = (fd, count - 1)
            elif count == 1:
                del self._claims[session_id]
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)

    def begin(self, session_id: str) -> None:
        """A stream holds the id: a save of it will come (or `settle`)."""
        with self._saves:
            self._num_saving[session_id] = self._num_saving.get(session_id, 0) + 1

    def settle(self, session_id: str) -> None:
        """The stream that held the id ended with nothing to save, or its save is written."""
        with self._saves:
            left = self._num_saving.get(session_id, 0) - 1
            if left > 0:
                self._num_saving[session_id] = left
            else:
                self._num_saving.pop(session_id, None)
            self._saves.notify_all()
        self._release(session_id)

    def path_for(self, session_id: str) -> Path:
        return self.directory / (hashlib.sha256(session_id.encode()).hexdigest()[:40] + SUFFIX)

    # ------------------------------------------------------------------ load

    def load(self, session_id: str, wait_s: float = 10.0) -> SavedSession | None:
        """The saved session, or None (missing, or discarded because it cannot be trusted).
        Waits up to `wait_s` for a save of the id still on its way, else PreconditionFailed.
        Claims the id (see `_claim`) until the stream that opens it settles."""
        self._claim(session_id)
        try:
            return self._load(session_id, wait_s)
        except BaseException:
            self._release(session_id)
            raise

    def _load(self, session_id: str, wait_s: float) -> SavedSession | None:
        with self._saves:
            if not self._saves.wait_for(lambda: session_id not in self._num_saving, wait_s):
                raise PreconditionFailed(
                    f"session {session_id!r} is still being saved by the stream that used it; retry",
                    field="config.session_id",
                    retry_after_s=1.0,
                )
        path = self.path_for(session_id)
        try:
            blob = path.read_bytes()
        except FileNotFoundError:
            self.metrics.session_cache.labels("miss").inc()
            return None
        try:
            record = self._decode(blob, session_id)
        except ValueError as exc:
            log.warning("session_discarded", session_id=session_id, reason=str(exc), path=str(path))
            self.metrics.session_cache.labels("discarded").inc()
            self.discard(session_id)
            return None
        os.utime(path)  # least recently used goes first
        self.metrics.session_cache.labels("hit").inc()
        return record

    def _decode(self, blob: bytes, session_id: str) -> SavedSession:
        try:
            record = self._parse(blob, session_id)
        except (KeyError, TypeError, IndexError, struct.error, UnicodeDecodeError) as exc:
            raise ValueError(f"malformed header ({type(exc).__name__})") from None
        if len(record.tokens) > self.max_tokens:  # pending input that does not fit ends its turn CONTEXT_FULL
            raise ValueError(f"{len(record.tokens)} tokens do not fit a slot of {self.max_tokens}")
        if any(not 0 <= t < self.n_vocab for t in (*record.tokens, *record.pending)):
            raise ValueError("token ids outside the vocabulary")
        return record

    def _parse(self, blob: bytes, session_id: str) -> SavedSession:
        if not blob.startswith(MAGIC):
            raise ValueError("not a session file")
        body = blob[len(MAGIC) + 32 :]
        if hashlib.sha256(body).digest() != blob[len(MAGIC) : len(MAGIC) + 32]:
            raise ValueError("checksum mismatch (corrupt file)")
        (header_len,) = struct.unpack("<I", body[:4])
        header = json.loads(body[4 : 4 + header_len])
        if header.get("fingerprint") != self.fingerprint:
            raise ValueError("made with another model or KV layout")
        if header.get("session_id") != session_id:
            raise ValueError("belongs to another session id")
        chat = header.get("chat")
        return SavedSession(
            session_id=session_id,
            tokens=tuple(header["tokens"]),
            pending=tuple(header["pending"]),
            chat=tuple((m[0], m[1]) for m in chat) if chat is not None else None,
            state=body[4 + header_len :],
        )

    def discard(self, session_id: str) -> None:
        self.path_for(session_id).unlink(missing_ok=True)
        self._update_bytes()

    # ------------------------------------------------------------------ save

    def save_async(self, record: SavedSession) -> None:
        """Write on the writer thread (the executor only copies the state out); settles the id."""
        future = self._writer.submit(self._save_and_settle, record)
        future.add_done_callback(_log_failure)

    def _save_and_settle(self, record: SavedSession) -> None:
        try:
            self._save(record)
        finally:
            self.settle(record.session_id)

    def _save(self, record: SavedSession) -> None:
        header = json.dumps(
            {
                "session_id": record.session_id,
                "tokens": list(record.tokens),
                "pending": list(record.pending),
                "chat": [list(m) for m in record.chat] if record.chat is not None else None,
                "fingerprint": self.fingerprint,
            }
        ).encode()
        body = struct.pack("<I", len(header)) + header + record.state
        blob = MAGIC + hashlib.sha256(body).digest() + body
        tmp_path: str | None = None
        try:
            with tempfile.NamedTemporaryFile(dir=self.directory, suffix=".tmp", delete=False) as tmp:
                tmp_path = tmp.name
                tmp.write(blob)
                tmp.flush()
                os.fsync(tmp.fileno())
            os.replace(tmp_path, self.path_for(record.session_id))
        except OSError as exc:
            log.error("session_save_failed", session_id=record.session_id, error=str(exc))
            if tmp_path is not None:
                Path(tmp_path).unlink(missing_ok=True)
            return
        self.metrics.session_cache.labels("saved").inc()
        log.info("session_saved", session_id=record.session_id, tokens=len(record.tokens), bytes=len(blob))
        self._evict()

    def _evict(self) -> None:
        with self._lock:
            files = sorted(self.directory.glob("*" + SUFFIX), key=lambda p: p.stat().st_mtime)
            total = sum(p.stat().st_size for p in files)
            while files and total > self.max_bytes:
                oldest = files.pop(0)
                total -= oldest.stat().st_size
                oldest.unlink(missing_ok=True)
                self.metrics.session_cache.labels("evicted").inc()
            self.metrics.session_cache_bytes.set(total)

    def _update_bytes(self) -> None:
        self.metrics.session_cache_bytes.set(sum(p.stat().st_size for p in self.directory.glob("*" + SUFFIX)))

    def close(self) -> None:
        """Finish pending writes."""
        self._writer.shutdown(wait=True)


def _log_failure(future: Future[None]) -> None:
    if future.exception() is not None:
        log.error("session_save_failed", error=repr(future.exception()))
