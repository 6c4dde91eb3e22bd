"""One open session, as its surface sees it: input in, events observed.

The handle lives on the event-loop thread. It keeps the session's input rules (token
limits, the turn queue, text vs chat) and its `Conversation`, and queues commands to the
executor thread. A surface only translates: it tokenizes what the client sent and hands
it here; its `Call` (engine/call.py) shows the handle each event before the surface sends
it on. Refusals are `InvalidRequest` / `PreconditionFailed` naming the request field.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import replace

from ..domain.errors import Field, InvalidRequest, PreconditionFailed
from ..domain.events import FinishReason, TokenEvent, TurnEndEvent
from ..domain.model_meta import Limits
from ..domain.snapshots import SavedSession
from .chat.chat import ChatMessage, Conversation
from .chat.native_reply import NativeReader
from .chat.tool_formats import GENERIC, ToolFormat
from .chat.tool_messages import as_generic_messages, call_arguments
from .chat.tool_plan import ToolPlan
from .chat.tool_reply import ReplyReader
from .executor.executor import Executor

MAX_TURNS_PENDING = 2  # the running turn and one queued behind it

# The conversation (with the tools' preamble, if any) as tokens, rendered off the event loop.
RenderChat = Callable[[Sequence[ChatMessage], "ToolPlan | None"], Future[tuple[int, ...]]]


class SessionHandle:
    """Every method runs on the event-loop thread and only queues commands for the executor."""

    def __init__(self, executor: Executor, key: int, conversation: Conversation, limits: Limits,
                 render_chat: RenderChat | None, max_input_tokens: int, max_tokens: int | None,
                 add_bos: bool, restore: SavedSession | None, tools: ToolPlan | None = None,
                 tool_format: ToolFormat = GENERIC) -> None:
        """`key`: the executor's name for the session; `conversation`: the one the executor
        saves with a named session; `render_chat`: the chat template as tokens, on the
        engine's offload pool (None: the model has none); `max_tokens`: the request's per-turn limit (the prompt and it
        must fit a slot; None: not asked, or -n's default); `add_bos`: whether the first text
        starts with BOS; `restore`: the saved session it goes on from; `tools`: an active
        plan's tools are rendered and each reply is read for calls, in `tool_format` (the
        engine's; its constraint must be the session's grammar)."""
        self._executor = executor
        self.key = key
        self.conversation = conversation
        self._limits = limits
        self._render_chat = render_chat
        self._max_input_tokens = max_input_tokens
        self._max_tokens = max_tokens
        self.num_turns_open = 0
        self._turn_tokens = 0  # input of the turn being sent
        # All input the session was sent, with a restored history (already in the KV, BOS first).
        self._session_tokens = len(restore.tokens) + len(restore.pending) if restore is not None else 0
        self._has_history = restore is not None
        self.needs_bos = add_bos and restore is None
        self._tools = tools if tools is not None and tools.active else None
        self._tool_format = tool_format
        self._replies: dict[int, ReplyReader | NativeReader] = {}  # per sample, with tools

    @property
    def num_turns_pending(self) -> int:
        """Turns open in the engine plus chat turns waiting to be rendered."""
        return self.num_turns_open + self.conversation.num_deferred_turns

    # ------------------------------------------------------------------ input

    def check_takes_tokens(self) -> None:
        """Text or token ids may come (InvalidRequest once the session uses chat messages)."""
        if self.conversation.started:
            raise InvalidRequest("a session that uses chat messages must keep to messages", field=Field.INPUT)

    def add_tokens(self, tokens: tuple[int, ...], end_of_turn: bool) -> None:
        """Input tokens (possibly none: a bare end_of_turn); the turn runs on `end_of_turn`."""
        if tokens:
            self.check_takes_tokens()
            self.needs_bos = False
            self._turn_tokens += len(tokens)
            self._session_tokens += len(tokens)
            self._check_sizes()
        if end_of_turn:
            self._open_turn(tokens)
        elif tokens:
            self._executor.add_input(self.key, tokens, False)

    def end_input(self) -> None:
        """The client half-closed: input sent without end_of_turn runs as a last turn."""
        if self._turn_tokens:
            self._open_turn(())

    async def add_messages(self, messages: list[ChatMessage], end_of_turn: bool) -> None:
        """Chat messages: rendered with the conversation once no reply runs (else deferred)."""
        if self._render_chat is None:
            raise PreconditionFailed(
                "the model has no chat template (tokenizer.chat_template); start the server with "
                "--chat-template-file, or send text or token ids"
            )
        if not self.conversation.started and (self._has_history or self._turn_tokens):
            raise InvalidRequest("a session that started with text or tokens cannot switch to messages", field=Field.INPUT)
        if self._tool_format.native:  # kept as they are for the template; InvalidRequest: arguments not JSON
            call_arguments(messages)
        else:  # kept as the plain text they render as
            messages = as_generic_messages(messages)
        self.conversation.check(messages)
        if end_of_turn and self.num_turns_pending >= MAX_TURNS_PENDING:
            raise self._turn_queue_full()
        if self.num_turns_open or self.conversation.has_deferred:
            self.conversation.defer(messages, end_of_turn)
        else:
            await self._chat_turn(messages, end_of_turn)

    async def _chat_turn(self, messages: list[ChatMessage], end_of_turn: bool) -> None:
        """The whole rendering is the turn's input (the KV reuses its prefix, so only the new
        tokens are prefilled)."""
        assert self._render_chat is not None
        conversation = self.conversation.add(messages, end_of_turn)
        tokens = await asyncio.wrap_future(self._render_chat(conversation, self._tools))
        self._turn_tokens = self._session_tokens = len(tokens)
        self._check_sizes()
        if end_of_turn:
            self._open_turn(tokens, replace=True)
        else:
            self._executor.add_input(self.key, tokens, False, replace=True)

    def _check_sizes(self) -> None:
        if self._turn_tokens > self._limits.n_ctx_per_slot:
            raise InvalidRequest(
                f"the turn's input has {self._turn_tokens} tokens, more than the per-slot context "
                f"of {self._limits.n_ctx_per_slot}",
                field=Field.INPUT,
            )
        if self._session_tokens > self._max_input_tokens:
            raise InvalidRequest(
                f"the session's input reached {self._session_tokens} tokens, more than the limit "
                f"of {self._max_input_tokens} (--max-input-tokens)",
                field=Field.INPUT,
            )

    def _turn_queue_full(self) -> PreconditionFailed:
        return PreconditionFailed(
            "a turn is already queued behind the running one: wait for its turn_end before the next end_of_turn",
            field=Field.END_OF_TURN,
        )

    def _open_turn(self, tokens: tuple[int, ...], replace: bool = False) -> None:
        limits = self._limits
        if self._turn_tokens == 0 and not self._has_history:
            raise InvalidRequest("the turn has no input: send text or token ids", field=Field.INPUT)
        if self.num_turns_pending >= MAX_TURNS_PENDING:
            raise self._turn_queue_full()
        if not self._has_history and self._max_tokens and not limits.context_shift:
            if self._turn_tokens + self._max_tokens > limits.n_ctx_per_slot:
                raise InvalidRequest(
                    f"the prompt ({self._turn_tokens} tokens) plus max_tokens ({self._max_tokens}) exceed the per-slot "
                    f"context of {limits.n_ctx_per_slot} (n_kv_req > n_ctx); shorten them or start the server "
                    "with --context-shift",
                    field=Field.MAX_TOKENS,
                )
        self.num_turns_open += 1
        self._has_history = True
        self._turn_tokens = 0
        if self.conversation.started:
            self.conversation.begin_reply()
        self._executor.add_input(self.key, tokens, True, replace)

    # ----------------------------------------------------------------- events

    async def observe(self, event: object) -> tuple[object, ...]:
        """`Call.events` calls this with each event and hands on what it returns: sample 0's
        text is the chat's reply; a turn's end lets deferred chat messages run. With tools,
        token events carry the answer's text and the calls as they form, and a turn end
        the parsed calls, after the answer's last text if it was held back (`_read_reply`)."""
        chat = self.conversation.started
        if isinstance(event, TokenEvent) and event.index == 0 and chat:
            self.conversation.on_reply_text(event.text)
        elif isinstance(event, TurnEndEvent):
            if event.final:
                self.num_turns_open -= 1
            if event.index == 0 and chat:
                self.conversation.end_reply()
            if event.final:
                await self._run_deferred()
        return self._read_reply(event) if self._tools is not None else (event,)

    def _reader(self, index: int) -> ReplyReader | NativeReader:
        if index not in self._replies:
            fmt = self._tool_format
            self._replies[index] = NativeReader(fmt) if fmt.native else ReplyReader()
        return self._replies[index]

    def _read_reply(self, event: object) -> tuple[object, ...]:
        if isinstance(event, TokenEvent):
            text, calls = self._reader(event.index).feed(event.text)
            return (replace(event, text=text, tool_calls=calls),)
        if isinstance(event, TurnEndEvent):
            reader = self._reader(event.index)
            del self._replies[event.index]
            rest = reader.flush()
            reply = reader.finish()
            if reply.tool_calls and event.finish_reason in (FinishReason.STOP, FinishReason.STOP_SEQUENCE):
                event = replace(event, finish_reason=FinishReason.TOOL_CALLS, tool_calls=reply.tool_calls)
            return (TokenEvent(rest, (), index=event.index), event) if rest else (event,)
        return (event,)

    async def _run_deferred(self) -> None:
        while self.conversation.has_deferred and not self.num_turns_open:
            deferred = self.conversation.next_deferred()
            assert deferred is not None
            await self._chat_turn(*deferred)

    # --------------------------------------------------------------- controls

    def cancel(self) -> None:
        """End the running turn CANCELLED; the session stays."""
        self._executor.cancel(self.key)

    def close(self) -> None:
        """The stream is over: free the slot (a named session is saved, with its conversation)."""
        self._executor.close(self.key)
