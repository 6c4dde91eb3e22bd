"""Prefix affinity without a key (client/llmserve/client/affinity.py): one-shot calls that
share a head carry one affinity key (with `derive_affinity`); a caller's key, session id
or LoRA adapter wins; without them none is derived."""

from __future__ import annotations

from llmserve.client.affinity import HEAD_CHARS, prefix_affinity_key
from llmserve.client.connection import AFFINITY_HEADER, ConnectionOptions
from llmserve.client.requests import make_input, session_config

SYSTEM = {"role": "system", "content": "You answer questions about the attached contract."}


def _key(prompt: object, **options: object) -> str | None:
    options.setdefault("derive_affinity", True)
    kwargs = ConnectionOptions(**options).call_kwargs(None, None, make_input(prompt))  # type: ignore[arg-type]
    return dict(kwargs["metadata"]).get(AFFINITY_HEADER)


def test_a_conversation_keeps_its_key_as_it_grows() -> None:
    first = [SYSTEM, {"role": "user", "content": "Who signed it?"}]
    later = [*first, {"role": "assistant", "content": "Alice."}, {"role": "user", "content": "When?"}]
    other = [SYSTEM, {"role": "user", "content": "What does it cost?"}]
    assert _key(first) == _key(later) != _key(other)
    assert _key(first).startswith("h-") and len(_key(first)) == 18  # type: ignore[union-attr]


def test_text_prompts_share_a_key_by_their_head() -> None:
    document = "Contract. " * (HEAD_CHARS // 10 + 1)
    assert _key(document + "Question one?") == _key(document + "Question two?")
    assert _key("Short prompt one") != _key("Short prompt two")
    assert _key([1, 2, 3]) != _key([1, 2, 4])


def test_a_callers_key_or_session_wins_and_opting_out_sends_none() -> None:
    prompt = [SYSTEM, {"role": "user", "content": "Hi"}]
    assert _key(prompt, affinity_key="tenant-7") == "tenant-7"
    session = ConnectionOptions(derive_affinity=True).call_kwargs(None, session_config(session_id="my-session"),
                                                                 make_input(prompt))
    assert dict(session["metadata"])[AFFINITY_HEADER] == "my-session"
    tuned = ConnectionOptions(derive_affinity=True).call_kwargs(None, session_config(adapter="support"), make_input(prompt))
    assert dict(tuned["metadata"])[AFFINITY_HEADER] == "a-support"  # one adapter's calls: one replica
    other = ConnectionOptions(derive_affinity=True).call_kwargs(None, session_config(model="q8"), make_input(prompt))
    assert dict(other["metadata"])[AFFINITY_HEADER] == "m-q8"  # and one model's
    assert _key(prompt, derive_affinity=False) is None
    assert _key("") is None  # nothing to derive from
    assert prefix_affinity_key(make_input([])) == ""


def test_the_keys_the_typescript_sdk_derives_too() -> None:
    """client/node/test/unit.test.ts checks the same vectors: a head reaches the same replica from either SDK."""
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Héllo 👋"},
            {"role": "assistant", "content": "Hi"}, {"role": "user", "content": "More"}]
    assert prefix_affinity_key(make_input(chat)) == "h-bdc19193a9d3d616"
    assert prefix_affinity_key(make_input("x" * 2000)) == "h-49abd65bbf7f7e40"
    assert prefix_affinity_key(make_input("👋" * 1100)) == "h-505f332a425ca867"  # code points, not UTF-16 units
    assert prefix_affinity_key(make_input(list(range(300)))) == "h-103d6b646b0bcb72"
