"""Stored conversations (engine/chat/stored.py): found only by their owner, bounded by count,
bytes and age, the oldest dropped first."""

from __future__ import annotations

import pytest
from llmserve.service.domain.events import ToolCall
from llmserve.service.engine.chat.chat import ChatMessage
from llmserve.service.engine.chat.stored import SIZE_OVERHEAD, ConversationStore, owner_of

ALICE, BOB = owner_of("Bearer alice"), owner_of("Bearer bob")


def _put(store: ConversationStore, key: str, owner: str = ALICE, text: str = "hi") -> None:
    store.put(key, owner, (ChatMessage("user", text),), {"id": key}, ({"id": "item_0"},))


def test_only_the_owner_finds_or_deletes_an_entry() -> None:
    store = ConversationStore()
    _put(store, "resp_1")
    assert store.get("resp_1", ALICE) is not None and store.get("resp_1", BOB) is None
    assert not store.delete("resp_1", BOB) and store.get("resp_1", ALICE) is not None
    assert store.delete("resp_1", ALICE) and store.get("resp_1", ALICE) is None and store.num_bytes == 0


def test_the_oldest_go_first_past_the_count_or_the_bytes() -> None:
    store = ConversationStore(max_stored=2)
    for key in ("a", "b", "c"):
        _put(store, key)
    assert [k for k in "abc" if store.get(k, ALICE)] == ["b", "c"] and len(store) == 2
    max_bytes = 2 * SIZE_OVERHEAD  # room for either entry, not both
    by_bytes = ConversationStore(max_bytes=max_bytes)
    _put(by_bytes, "small")
    _put(by_bytes, "large", text="x" * 150)
    assert by_bytes.get("small", ALICE) is None and by_bytes.get("large", ALICE) is not None
    assert by_bytes.num_bytes <= max_bytes


def test_an_entry_too_old_is_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    store = ConversationStore(max_age_s=10)
    now = [1000.0]
    monkeypatch.setattr("llmserve.service.engine.chat.stored.time.time", lambda: now[0])
    _put(store, "resp_1")
    now[0] += 9
    assert store.get("resp_1", ALICE) is not None
    now[0] += 2
    assert store.get("resp_1", ALICE) is None and len(store) == 0 and store.num_bytes == 0


def test_storing_a_key_again_replaces_it() -> None:
    store = ConversationStore()
    _put(store, "resp_1", text="one")
    _put(store, "resp_1", text="two, longer")
    entry = store.get("resp_1", ALICE)
    assert entry is not None and entry.messages[0].content == "two, longer" and len(store) == 1
    assert store.num_bytes == entry.size


def test_a_directory_keeps_them_across_a_restart(tmp_path) -> None:  # type: ignore[no-untyped-def]
    first = ConversationStore(directory=tmp_path)
    call = ToolCall("call_1", "get_weather", '{"city": "Paris"}')
    first.put("resp_a/../x", ALICE, (ChatMessage("user", "hi"), ChatMessage("assistant", "", (call,))),
              {"id": "resp_a/../x"}, ({"id": "item_0"},))
    _put(first, "resp_b")
    assert first.delete("resp_b", ALICE)
    first.close()  # the files are written off the caller's thread: a clean stop waits for them
    again = ConversationStore(directory=tmp_path)  # a new process
    entry = again.get("resp_a/../x", ALICE)
    assert entry is not None and entry.messages[1].tool_calls == (call,) and entry.record == {"id": "resp_a/../x"}
    assert again.get("resp_b", ALICE) is None and again.get("resp_a/../x", BOB) is None
    assert len(list(tmp_path.iterdir())) == 1  # one file, named by a digest of the key


def test_a_directory_that_fails_leaves_memory(tmp_path) -> None:  # type: ignore[no-untyped-def]
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    store = ConversationStore(directory=blocker / "responses")
    _put(store, "resp_1")
    assert store.get("resp_1", ALICE) is not None
