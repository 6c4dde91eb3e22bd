"""The saved-session file format, and writing a file so that a crash or a failed write
never leaves a half-written one in its place.

Layout: MAGIC, sha256 of the rest, u32 header length, JSON header (session id, tokens
in the KV, pending tokens, chat messages, the LoRA adapters its KV was computed under, and
the fingerprint of the model and KV layout
it was made with), then the bytes of `llama_state_seq_get_data`.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import struct
import tempfile
from pathlib import Path
from typing import Any

from ..config import KVCacheSettings
from ..domain.snapshots import SavedSession

MAGIC = b"LLMSERVE-SESSION-1\n"
SUFFIX = ".session"


def model_fingerprint(model_path: Path, meta: Any, kv: KVCacheSettings) -> dict[str, object]:
    """What a saved state depends on: the model file and the KV layout."""
    with model_path.open("rb") as f:
        head = hashlib.sha256(f.read(1 << 20)).hexdigest()
    return {
        "model_bytes": model_path.stat().st_size,
        "model_head_sha256": head,
        "architecture": meta.architecture,
        "n_embd": meta.n_embd,
        "cache_type_k": kv.cache_type_k,
        "cache_type_v": kv.cache_type_v,
        "swa_full": kv.swa_full,
    }


def encode(record: SavedSession, fingerprint: dict[str, object]) -> bytes:
    header = json.dumps(
        {
            "session_id": record.session_id,
            "tokens": list(record.tokens),
            "pending": list(record.pending),
            "chat": [list(m) for m in record.chat] if record.chat is not None else None,
            "adapters": [list(a) for a in record.adapters],
            "fingerprint": fingerprint,
        }
    ).encode()
    body = struct.pack("<I", len(header)) + header + record.state
    return MAGIC + hashlib.sha256(body).digest() + body


def decode(blob: bytes, session_id: str, fingerprint: dict[str, object]) -> SavedSession:
    """The record, or ValueError saying why the file cannot be trusted."""
    try:
        return _parse(blob, session_id, fingerprint)
    except (KeyError, TypeError, IndexError, struct.error, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"malformed header ({type(exc).__name__})") from None


def _parse(blob: bytes, session_id: str, fingerprint: dict[str, object]) -> SavedSession:
    if not blob.startswith(MAGIC):
        raise ValueError("not a session file")
    body = blob[len(MAGIC) + 32 :]
    if hashlib.sha256(body).digest() != blob[len(MAGIC) : len(MAGIC) + 32]:
        raise ValueError("checksum mismatch (corrupt file)")
    (header_len,) = struct.unpack("<I", body[:4])
    header = json.loads(body[4 : 4 + header_len])
    if header.get("fingerprint") != fingerprint:
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
        adapters=tuple((str(name), float(scale)) for name, scale in header.get("adapters", [])),
    )


def write_atomically(path: Path, blob: bytes, fail_halfway: bool = False) -> None:
    """`path` holds `blob`, or (on OSError) whatever it held before: the bytes go to a
    temporary file in the same directory, are fsynced, renamed over `path`, and the
    directory is fsynced so the rename itself survives a power cut. `fail_halfway`
    (fault injection) raises ENOSPC after half the bytes, as a full disk would."""
    tmp_path: str | None = None
    try:
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".", suffix=".tmp", delete=False) as tmp:
            tmp_path = tmp.name
            if fail_halfway:
                tmp.write(blob[: len(blob) // 2])
                tmp.flush()
                raise OSError(errno.ENOSPC, "No space left on device (injected halfway through the write)")
            tmp.write(blob)
            tmp.flush()
            os.fsync(tmp.fileno())
        os.replace(tmp_path, path)
        tmp_path = None
        directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
    finally:
        if tmp_path is not None:
            try:
                os.unlink(tmp_path)
            except OSError:
                pass  # the directory is gone or read-only: nothing was renamed over `path`
