"""Chat sessions through the engine's `SessionHandle` and `Conversation` on the fake runner.

The "chat template" here renders BOS and then each message's letters as token ids
(a=0 ... z=25), which is also how the fake runner's tokens print, so a reply rendered
back is the same tokens the fake generated. The executor is driven by hand and every
event is shown to the handle as a transport would (`observe`) before it is checked.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import replace

import pytest
from llmserve.service.domain.errors import Field, InvalidRequest, PreconditionFailed
from llmserve.service.domain.events import TurnEndEvent
from llmserve.service.domain.model_meta import Limits
from llmserve.service.domain.requests import SamplingParams
from llmserve.service.engine.chat.chat import ChatMessage, Conversation
from llmserve.service.engine.session_handle import SessionHandle

from .engine_harness import ListSink, RecordingStore, assert_kv_mirrors_slots, make, params
from .fake_runner import BOS

LIMITS = Limits(n_vocab=64, n_ctx_per_slot=256)


def render(messages: Sequence[ChatMessage], _tools: object = None) -> Future[tuple[int, ...]]:
    """As the engine's, a future of the rendering (done at once here)."""
    rendered: Future[tuple[int, ...]] = Future()
    rendered.set_result((BOS, *(ord(c) - ord("a") for m in messages for c in m.content)))
    return rendered


def user(text: str) -> ChatMessage:
    return ChatMessage("user", text)


class Chat:
    """One chat session on a fake executor, its events observed as a transport would."""

    def __init__(self, num_samples: int = 1, session_id: str = "", max_tokens: int = 4) -> None:
        self.store = RecordingStore()
        self.executor, self.runner = make(4, store=self.store)
        self.sink = ListSink()
        p = replace(params(max_tokens=max_tokens), session_id=session_id, num_samples=num_samples)
        if num_samples > 1:
            p = replace(p, sampling=SamplingParams(temperature=1.0, seed=3))
        conversation = Conversation()
        key = self.executor.open_session(p, self.sink, conversation=conversation)
        self.handle = SessionHandle(self.executor, key, conversation, LIMITS, render, 10_000, max_tokens, True, None)
        self.seen = 0  # events already shown to the handle

    async def run_turns(self, n: int = 1) -> None:
        """Step until `n` more turns ended, showing each event to the handle."""
        target = len([e for e in self.sink.of(TurnEndEvent) if e.final]) + n
        for _ in range(500):
            self.executor.drain(block=False)
            while self.seen < len(self.sink.events):
                self.seen += 1
                await self.handle.observe(self.sink.events[self.seen - 1])
            if len([e for e in self.sink.of(TurnEndEvent) if e.final]) >= target:
                return
            self.executor.step()
        raise AssertionError("the turns did not end")


def test_each_turn_renders_the_whole_conversation_with_the_replies() -> None:
    async def scenario() -> None:
        chat = Chat()
        await chat.handle.add_messages([user("k")], True)
        await chat.run_turns()
        assert chat.sink.text() == "lmno"  # 10 -> 11, 12, 13, 14
        await chat.handle.add_messages([user("p")], True)
        await chat.run_turns()
        assert chat.sink.text() == "lmnoqrst"  # rendered k, lmno, p: 15 -> 16 ...
        assert chat.handle.conversation.saved() == (("user", "k"), ("assistant", "lmno"), ("user", "p"),
                                                    ("assistant", "qrst"))
        assert_kv_mirrors_slots(chat.executor, chat.runner)

    asyncio.run(scenario())


def test_messages_sent_mid_reply_wait_for_it_and_follow_it() -> None:
    async def scenario() -> None:
        chat = Chat()
        await chat.handle.add_messages([user("k")], True)
        chat.executor.drain(block=False)
        chat.executor.step()
        await chat.handle.add_messages([user("p")], True)  # deferred: the reply runs
        assert chat.handle.num_turns_open == 1 and chat.handle.num_turns_pending == 2
        with pytest.raises(PreconditionFailed) as refused:  # a third turn may not queue
            await chat.handle.add_messages([user("x")], True)
        assert refused.value.field == Field.END_OF_TURN
        await chat.run_turns(2)
        assert [m for m, _ in chat.handle.conversation.saved() or ()] == ["user", "assistant", "user", "assistant"]
        assert chat.sink.text() == "lmnoqrst"  # the second rendering held the first reply

    asyncio.run(scenario())


def test_a_named_chat_session_saves_what_the_client_saw() -> None:
    async def scenario() -> None:
        chat = Chat(session_id="c1", max_tokens=20)
        await chat.handle.add_messages([user("k")], True)
        for _ in range(4):  # part of the reply streams, then the client goes
            chat.executor.drain(block=False)
            chat.executor.step()
        while chat.seen < len(chat.sink.events):
            chat.seen += 1
            await chat.handle.observe(chat.sink.events[chat.seen - 1])
        partial = chat.sink.text()
        assert partial and len(partial) < 20
        chat.handle.close()
        chat.executor.drain(block=False)
        assert [s.chat for s in chat.store.saved] == [(("user", "k"), ("assistant", partial))]

    asyncio.run(scenario())


def test_unanswered_input_is_not_saved() -> None:
    conversation = Conversation((("user", "a"), ("assistant", "b")))
    conversation.add([user("c")], True)
    assert conversation.saved() == (("user", "a"), ("assistant", "b"))


def test_a_session_keeps_to_text_or_to_messages() -> None:
    async def scenario() -> None:
        chat = Chat()
        chat.handle.add_tokens((BOS, 10), False)
        with pytest.raises(InvalidRequest, match="cannot switch to messages"):
            await chat.handle.add_messages([user("k")], True)
        chat = Chat()
        await chat.handle.add_messages([user("k")], False)
        with pytest.raises(InvalidRequest, match="must keep to messages"):
            chat.handle.add_tokens((10,), True)
        with pytest.raises(InvalidRequest) as no_role:
            await chat.handle.add_messages([ChatMessage("", "x")], True)
        assert no_role.value.field == Field.MESSAGES.at(0, "role")

    asyncio.run(scenario())


def test_with_n_samples_the_reply_is_sample_0s() -> None:
    async def scenario() -> None:
        chat = Chat(num_samples=3)
        await chat.handle.add_messages([user("k")], True)
        await chat.run_turns()
        texts = [chat.sink.text(i) for i in range(3)]
        assert all(texts)
        assert chat.handle.conversation.saved() == (("user", "k"), ("assistant", texts[0]))
        await chat.handle.add_messages([user("z")], True)
        await chat.run_turns()
        assert chat.handle.num_turns_open == 0
        assert len(chat.handle.conversation.saved() or ()) == 4

    asyncio.run(scenario())
