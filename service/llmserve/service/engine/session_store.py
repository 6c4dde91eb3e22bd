"""Saved sessions: KV state on disk, so a named session survives the stream and restarts.

The file format and the atomic write are in `session_file.py`. Writes happen on a writer thread; the directory
is kept under `max_bytes` by deleting the least recently used files. A corrupt file, one made with another model
or KV layout, or whose tokens do not fit this server's slots or vocabulary is discarded and logged, never loaded.

A session id is saved at most once at a time and never read while a save of it is on its way: `begin` (when a
stream opens the id) counts a save to come, `settle` (the executor had nothing to save) or the written file ends
it, and `load` waits for it. So a stream that reopens an id at once gets the state the last one left.

Servers may share the directory (replicas on one volume): `load` takes an flock on `locks/<id>.lock` and holds
it until the stream's save settles, so another server that opens the id meanwhile gets `PreconditionFailed` with
a retry hint instead of a stale state, and two servers never write one session at once.

The directory is the environment's and may fail (not a directory, read-only, full, gone). A named session needs
it to hold its lock and read its state: when either fails the call gets `StorageFault` (naming the directory and
the error: the environment's fault), never a bug's failure, and never a turn served without a history that may
exist. A save that fails after its turn was served leaves the previous file as it was (`write_atomically`), so
the next stream goes on from that. The log says `session_dir_unusable` once when the directory starts failing
and `session_dir_recovered` once when a save works again, not once per call; `llmserve_session_dir_ok` and
`..._cache_total{result="dir_fault"}` count it.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import structlog

from ..domain.errors import Field, PreconditionFailed, StorageFault
from ..domain.snapshots import SavedSession
from ..faults import injected_target
from ..metrics import Metrics
from .session_file import SUFFIX, decode, encode, model_fingerprint, write_atomically

__all__ = ["SessionStore", "StorageFault", "model_fingerprint"]

log = structlog.get_logger("llmserve.sessions")

FAULT_RETRY_S = 5.0  # the retry hint of a call refused for a failing directory


class SessionStore:
    def __init__(
        self, directory: Path, max_bytes: int, fingerprint: dict[str, object], metrics: Metrics,
        n_ctx_per_slot: int, n_vocab: int,
    ) -> None:
        """`n_ctx_per_slot`, `n_vocab`: a saved session must fit one slot and the vocabulary.
        A directory that cannot be made or written is logged (the server serves on)."""
        self.n_ctx_per_slot = n_ctx_per_slot
        self.n_vocab = n_vocab
        self.directory = directory
        self.max_bytes = max_bytes
        self.fingerprint = fingerprint
        self.metrics = metrics
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llmserve-session-writer")
        self._lock = threading.Lock()
        self._saves = threading.Condition()
        self._num_saving: dict[str, int] = {}  # session id -> saves to come
        self._claims: dict[str, tuple[int, int]] = {}  # session id -> (lock file fd, claims)
        self.fault: str | None = None  # why the directory fails, while it does
        self._fail_saves_of = injected_target("save_halfway")  # test only, see _save
        self._saved_once = False  # (of that id)
        metrics.session_dir_ok.set(1)
        for result in ("dir_fault", "save_failed"):
            metrics.session_cache.labels(result)  # exported at 0 from the start
        try:
            (directory / "locks").mkdir(parents=True, exist_ok=True)
            write_atomically(directory / ".probe", b"")  # it takes files, renames and fsyncs
            self._update_bytes()
        except OSError as exc:
            self._failing("opening it", exc)

    # ------------------------------------------------------------ faults

    def _failing(self, operation: str, exc: OSError) -> StorageFault:
        """The directory failed: say so once (until it works again), count it, and return
        the error a call that needed it gets."""
        reason = f"{operation}: {exc.strerror or exc}" + (f" ({exc.filename})" if exc.filename else "")
        message = (
            f"--session-dir {str(self.directory)!r} is unusable ({reason}); named sessions cannot be "
            "resumed or saved until it is fixed (calls without session_id are served)"
        )
        with self._lock:
            first, self.fault = self.fault is None, message
        if first:
            log.error("session_dir_unusable", path=str(self.directory), operation=operation,
                      error=exc.strerror or str(exc), errno=errno.errorcode.get(exc.errno or 0, ""))
            self.metrics.session_dir_ok.set(0)
        self.metrics.session_cache.labels("dir_fault").inc()
        return StorageFault(message, str(self.directory), retry_after_s=FAULT_RETRY_S)

    def _works(self) -> None:
        with self._lock:
            was, self.fault = self.fault, None
        if was is not None:
            log.info("session_dir_recovered", path=str(self.directory))
            self.metrics.session_dir_ok.set(1)

    # ------------------------------------------------------------ claims

    def _claim(self, session_id: str) -> None:
        """Hold the id's lock file (flock) until its stream's save settles, so servers that
        share the directory never use or write one session at once."""
        with self._lock:
            if session_id in self._claims:  # this server holds it already (a reopen)
                fd, count = self._claims[session_id]
                self._claims[session_id] = (fd, count + 1)
                return
            fd, error = -1, None
            try:
                fd = self._open_lock(session_id)
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self._claims[session_id] = (fd, 1)
            except BlockingIOError:
                os.close(fd)
                raise PreconditionFailed(
                    f"session {session_id!r} is open on another server that shares --session-dir; retry",
                    field=Field.SESSION_ID, retry_after_s=1.0,
                ) from None
            except OSError as exc:  # no such directory, read-only, no locks on this volume (ENOLCK)
                error = exc
                if fd >= 0:
                    os.close(fd)
        if error is not None:
            raise self._failing(f"taking the lock of session {session_id!r}", error) from None

    def _open_lock(self, session_id: str) -> int:
        locks = self.directory / "locks"
        name = self.path_for(session_id).with_suffix(".lock").name
        try:
            return os.open(locks / name, os.O_RDWR | os.O_CREAT, 0o600)
        except FileNotFoundError:  # the directory was made or replaced after the start (never its parents)
            locks.mkdir(exist_ok=True)
            return os.open(locks / name, os.O_RDWR | os.O_CREAT, 0o600)

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
        Claims the id (see `_claim`) until the stream that opens it settles. StorageFault
        when the directory fails."""
        self._claim(session_id)
        try:
            return self._load(session_id, wait_s)
        except BaseException:
            self._release(session_id)
            raise

    def read(self, session_id: str, wait_s: float = 10.0) -> SavedSession | None:
        """`load` without the claim: a state written once, never again (a stored turn's), that many calls may read."""
        return self._load(session_id, wait_s)

    def _load(self, session_id: str, wait_s: float) -> SavedSession | None:
        with self._saves:
            if not self._saves.wait_for(lambda: session_id not in self._num_saving, wait_s):
                raise PreconditionFailed(
                    f"session {session_id!r} is still being saved by the stream that used it; retry",
                    field=Field.SESSION_ID,
                    retry_after_s=1.0,
                )
        path = self.path_for(session_id)
        try:
            blob = path.read_bytes()
        except FileNotFoundError:
            self.metrics.session_cache.labels("miss").inc()
            return None
        except OSError as exc:  # the state may exist: serving without it would drop a history
            raise self._failing(f"reading session {session_id!r}", exc) from None
        try:
            record = self._decode(blob, session_id)
        except ValueError as exc:
            log.warning("session_discarded", session_id=session_id, reason=str(exc), path=str(path))
            self.metrics.session_cache.labels("discarded").inc()
            self.discard(session_id)
            return None
        try:
            os.utime(path)  # least recently used goes first
        except OSError:
            pass  # only the eviction order: a read-only directory fails at the save, said there
        self.metrics.session_cache.labels("hit").inc()
        return record

    def _decode(self, blob: bytes, session_id: str) -> SavedSession:
        record = decode(blob, session_id, self.fingerprint)
        if len(record.tokens) > self.n_ctx_per_slot:  # pending input that does not fit ends its turn CONTEXT_FULL
            raise ValueError(f"{len(record.tokens)} tokens do not fit a slot of {self.n_ctx_per_slot}")
        if any(not 0 <= t < self.n_vocab for t in (*record.tokens, *record.pending)):
            raise ValueError("token ids outside the vocabulary")
        return record

    def discard(self, session_id: str) -> None:
        try:
            self.path_for(session_id).unlink(missing_ok=True)
            self._update_bytes()
        except OSError as exc:
            self._failing(f"deleting the untrusted file of session {session_id!r}", exc)

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
        """Test only: `LLMSERVE_INJECT_FAULT=save_halfway:<session id>` fails every save of
        that id after its first one halfway through the write (ENOSPC)."""
        blob = encode(record, self.fingerprint)
        inject = record.session_id == self._fail_saves_of
        try:
            write_atomically(self.path_for(record.session_id), blob, fail_halfway=inject and self._saved_once)
        except OSError as exc:
            self._failing(f"saving session {record.session_id!r}", exc)
            self.metrics.session_cache.labels("save_failed").inc()
            return
        self._saved_once |= inject
        self._works()
        self.metrics.session_cache.labels("saved").inc()
        log.info("session_saved", session_id=record.session_id, tokens=len(record.tokens), bytes=len(blob))
        try:
            self._evict()
        except OSError as exc:
            self._failing("evicting the least recently used sessions", exc)

    def _sizes(self) -> list[tuple[float, int, Path]]:
        """(mtime, bytes, path) of the saved files; one another server deletes meanwhile is skipped."""
        found = []
        for path in self.directory.glob("*" + SUFFIX):
            try:
                stat = path.stat()
            except FileNotFoundError:
                continue
            found.append((stat.st_mtime, stat.st_size, path))
        return sorted(found)

    def _evict(self) -> None:
        with self._lock:
            files = self._sizes()
            total = sum(size for _, size, _ in files)
            while files and total > self.max_bytes:
                _, size, oldest = files.pop(0)
                total -= size
                oldest.unlink(missing_ok=True)
                self.metrics.session_cache.labels("evicted").inc()
            self.metrics.session_cache_bytes.set(total)

    def _update_bytes(self) -> None:
        self.metrics.session_cache_bytes.set(sum(size for _, size, _ in self._sizes()))

    def close(self) -> None:
        """Finish pending writes."""
        self._writer.shutdown(wait=True)


def _log_failure(future: Future[None]) -> None:
    if future.exception() is not None:
        log.error("session_save_failed", error=repr(future.exception()))
