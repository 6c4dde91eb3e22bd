"""SessionStore when its directory fails (issue 26): a clear StorageFault naming the
directory, one log line per fault (not per call), and the previous save never harmed."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from llmserve.service.domain.errors import StorageFault
from llmserve.service.domain.snapshots import SavedSession
from llmserve.service.engine.session_store import SessionStore
from llmserve.service.metrics import Metrics
from structlog.testing import capture_logs

FINGERPRINT = {"model": "test"}


def _store(directory: Path) -> tuple[SessionStore, Metrics]:
    metrics = Metrics()
    return SessionStore(directory, 1 << 30, FINGERPRINT, metrics, n_ctx_per_slot=100, n_vocab=50), metrics


def _record(session_id: str, tokens: tuple[int, ...]) -> SavedSession:
    return SavedSession(session_id, tokens, (), None, bytes(range(256)) * 64)


def _save(store: SessionStore, record: SavedSession) -> None:
    store.begin(record.session_id)
    store.save_async(record)
    store.load(record.session_id)  # waits for the save
    store.settle(record.session_id)  # as the stream that opened it would


def _events(logs: list[dict[str, object]], name: str) -> int:
    return sum(entry["event"] == name for entry in logs)


def _dir_ok(metrics: Metrics) -> float:
    return metrics.registry.get_sample_value("llmserve_session_dir_ok") or 0.0


def test_a_file_where_the_directory_should_be(tmp_path: Path) -> None:
    directory = tmp_path / "sessions"
    directory.write_text("not a directory")
    with capture_logs() as logs:
        store, metrics = _store(directory)
        for _ in range(3):
            with pytest.raises(StorageFault) as fault:
                store.load("a")
    assert str(directory) in str(fault.value) and "--session-dir" in str(fault.value)
    assert fault.value.path == str(directory) and fault.value.retry_after_s
    assert _events(logs, "session_dir_unusable") == 1  # once, not once per call
    assert _dir_ok(metrics) == 0
    directory.unlink()
    directory.mkdir()  # fixed: the next call works and the next good save says so
    with capture_logs() as logs:
        assert store.load("a") is None
        store.begin("a")
        store.save_async(_record("a", (1, 2, 3)))
        store.close()
    assert _events(logs, "session_dir_recovered") == 1 and _dir_ok(metrics) == 1


def test_a_directory_replaced_mid_run_keeps_the_previous_save(tmp_path: Path) -> None:
    directory, away = tmp_path / "sessions", tmp_path / "away"
    store, metrics = _store(directory)
    _save(store, _record("a", (1, 2, 3)))
    directory.rename(away)
    directory.write_text("not a directory")
    with capture_logs() as logs:
        for _ in range(2):
            with pytest.raises(StorageFault):
                store.load("a")
        store.begin("b")
        store.save_async(_record("b", (4,)))  # a stream that was open when it happened
        deadline = time.monotonic() + 10
        while not metrics.registry.get_sample_value("llmserve_session_cache_total", {"result": "save_failed"}):
            assert time.monotonic() < deadline
            time.sleep(0.01)
    directory.unlink()
    away.rename(directory)
    loaded = store.load("a")
    store.close()
    assert loaded is not None and loaded.tokens == (1, 2, 3)
    assert _events(logs, "session_dir_unusable") == 1


def test_a_save_that_fails_halfway_leaves_the_previous_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMSERVE_INJECT_FAULT", "save_halfway:a")
    directory = tmp_path / "sessions"
    store, metrics = _store(directory)
    _save(store, _record("a", (1, 2, 3)))
    before = store.path_for("a").read_bytes()
    with capture_logs() as logs:
        _save(store, _record("a", (1, 2, 3, 4, 5)))  # ENOSPC halfway through the write
    assert store.path_for("a").read_bytes() == before
    assert not [name for name in os.listdir(directory) if name.endswith(".tmp")]
    loaded = store.load("a")
    assert loaded is not None and loaded.tokens == (1, 2, 3)
    assert metrics.registry.get_sample_value("llmserve_session_cache_total", {"result": "save_failed"}) == 1
    assert [e["operation"] for e in logs if e["event"] == "session_dir_unusable"] == ["saving session 'a'"]
    assert store.fault is not None and "injected halfway" in store.fault
    store.close()


def test_a_state_saved_with_another_swa_cache_size_is_refused(tmp_path: Path) -> None:
    """A full-size SWA cache saves more window cells than a default one can hold."""
    from types import SimpleNamespace

    from llmserve.service.config import KVCacheSettings
    from llmserve.service.engine.session_file import decode, encode, model_fingerprint

    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF" + bytes(100))
    meta = SimpleNamespace(architecture="gemma3", n_embd=640)
    full = model_fingerprint(model, meta, KVCacheSettings(swa_full=True))
    default = model_fingerprint(model, meta, KVCacheSettings())
    blob = encode(_record("s", (1, 2, 3)), full)
    assert decode(blob, "s", full).tokens == (1, 2, 3)
    with pytest.raises(ValueError, match="another model or KV layout"):
        decode(blob, "s", default)


def test_a_saved_session_keeps_the_adapters_its_kv_was_computed_under() -> None:
    from dataclasses import replace

    from llmserve.service.engine.session_file import decode, encode

    record = replace(_record("s", (1, 2, 3)), adapters=(("mild", 0.5),))
    assert decode(encode(record, {}), "s", {}).adapters == (("mild", 0.5),)
    assert decode(encode(_record("s", (1,)), {}), "s", {}).adapters == ()
