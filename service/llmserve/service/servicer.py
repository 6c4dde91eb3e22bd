"""gRPC transport for LLMService: converts protos to domain values and streams events.

No model logic here: the servicer validates and tokenizes, hands work to the
executor, and turns the executor's events into responses. Statuses come from
`errors` (raise, never set codes by hand).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import structlog
from llmserve.v1 import llmserve_pb2 as pb
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc

from . import validation
from .bridge import LoopSink
from .domain import SessionFailed, TokenEvent, TurnEndEvent
from .embed_stream import EmbedStream
from .engine import Engine
from .errors import InvalidArgument, Unavailable, error_from_status_name, rpc_errors

log = structlog.get_logger("llmserve.servicer")


@dataclass
class _GenerateState:
    """What the request reader and the response writer of one Generate share (loop thread)."""

    turns_open: int = 0
    turn_tokens: int = 0
    has_history: bool = False
    needs_bos: bool = True
    client_done: bool = False


class _ClientDone:
    """The client half-closed its side of the stream."""


class _ReaderFailed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class LLMServicer(pb_grpc.LLMServiceServicer):
    def __init__(self) -> None:
        self.engine: Engine | None = None  # set once the model has loaded

    def _engine(self) -> Engine:
        if self.engine is None:
            raise Unavailable("the model is still loading")
        return self.engine

    # ----------------------------------------------------------------- Generate

    @rpc_errors
    async def Generate(self, request_iterator, context):  # type: ignore[no-untyped-def]
        engine = self._engine()
        first = await anext(aiter(request_iterator), None)
        if first is None:
            raise InvalidArgument("the stream ended before its first message", field="config")
        if not first.HasField("config"):
            raise InvalidArgument("the first message must carry the session config", field="config")
        params = validation.session_params(first.config, engine.limits)
        add_bos = first.config.add_bos if first.config.HasField("add_bos") else True
        state = _GenerateState(needs_bos=add_bos and engine.meta.add_bos)
        sink = LoopSink(asyncio.get_running_loop())
        key = engine.executor.open_session(params, sink)
        reader = asyncio.create_task(self._read_generate(engine, first, request_iterator, key, state, sink))
        bound = log.bind(request_id=params.request_id, session=key)
        try:
            while True:
                event = await sink.get()
                if isinstance(event, TokenEvent):
                    yield pb.GenerateResponse(
                        request_id=params.request_id,
                        chunk=pb.TokenChunk(text=event.text, token_ids=event.token_ids),
                    )
                elif isinstance(event, TurnEndEvent):
                    state.turns_open -= 1
                    bound.info(
                        "turn_end",
                        finish_reason=event.finish_reason.name,
                        prompt_tokens=event.prompt_tokens,
                        cached_tokens=event.cached_tokens,
                        completion_tokens=event.completion_tokens,
                        ttft_ms=round(event.ttft_ms, 1),
                    )
                    yield pb.GenerateResponse(request_id=params.request_id, turn_end=_turn_end(event))
                    if state.client_done and state.turns_open == 0:
                        return
                elif isinstance(event, _ClientDone):
                    if state.turns_open == 0:
                        return
                elif isinstance(event, SessionFailed):
                    raise error_from_status_name(event.status, event.message)
                elif isinstance(event, _ReaderFailed):
                    raise event.error
        finally:
            reader.cancel()
            engine.executor.close(key)

    async def _read_generate(self, engine, first, request_iterator, key, state, sink) -> None:  # type: ignore[no-untyped-def]
        try:
            self._on_generate_message(engine, first, key, state)
            async for message in request_iterator:
                self._on_generate_message(engine, message, key, state)
            if state.turn_tokens:  # input without end_of_turn, then half-close: run it
                self._end_turn(engine, key, state, ())
            state.client_done = True
            sink.put_local(_ClientDone())
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - handed to the writer, which maps it
            sink.put_local(_ReaderFailed(exc))

    def _on_generate_message(self, engine: Engine, message: pb.GenerateRequest, key: int, state: _GenerateState) -> None:
        if message.cancel:
            engine.executor.cancel(key)
        tokens: tuple[int, ...] = ()
        if message.HasField("input"):
            tokens = self._input_tokens(engine, message.input, "input", state.needs_bos)
            state.needs_bos = False
            state.turn_tokens += len(tokens)
            if state.turn_tokens > engine.limits.n_ctx_per_slot:
                raise InvalidArgument(
                    f"the turn's input has {state.turn_tokens} tokens, more than the per-slot context "
                    f"of {engine.limits.n_ctx_per_slot}",
                    field="input",
                )
        if message.end_of_turn:
            self._end_turn(engine, key, state, tokens)
        elif tokens:
            engine.executor.add_input(key, tokens, False)

    def _end_turn(self, engine: Engine, key: int, state: _GenerateState, tokens: tuple[int, ...]) -> None:
        if state.turn_tokens == 0 and not state.has_history:
            raise InvalidArgument("the turn has no input: send text or token ids", field="input")
        state.turns_open += 1
        state.has_history = True
        state.turn_tokens = 0
        engine.executor.add_input(key, tokens, True)

    @staticmethod
    def _input_tokens(engine: Engine, msg: pb.Input, field: str, add_bos: bool) -> tuple[int, ...]:
        kind = msg.WhichOneof("kind")
        if kind == "text":
            if not msg.text:
                raise InvalidArgument("text input must not be empty", field=f"{field}.text")
            return tuple(engine.runner.tokenize(msg.text, add_special=add_bos, parse_special=True))
        if kind == "tokens":
            if not msg.tokens.ids:
                raise InvalidArgument("token input must not be empty", field=f"{field}.tokens.ids")
            return validation.token_ids(msg.tokens.ids, engine.limits, f"{field}.tokens.ids")
        raise InvalidArgument("input must hold text or tokens", field=field)

    # -------------------------------------------------------------------- Embed

    @rpc_errors
    async def Embed(self, request_iterator, context):  # type: ignore[no-untyped-def]
        engine = self._engine()
        stream = EmbedStream(engine, self._input_tokens)
        async for result in stream.run(request_iterator):
            yield pb.EmbedResponse(
                index=result.index,
                embedding=result.vector.tolist(),
                num_tokens=result.num_tokens,
                truncated=result.truncated,
            )

    # -------------------------------------------------------------------- Unary

    @rpc_errors
    async def Tokenize(self, request: pb.TokenizeRequest, context) -> pb.TokenizeResponse:  # type: ignore[no-untyped-def]
        runner = self._engine().runner
        ids = runner.tokenize(request.text, request.add_special, request.parse_special)
        pieces = [runner.piece(t, special=True) for t in ids] if request.with_pieces else []
        return pb.TokenizeResponse(ids=ids, pieces=pieces)

    @rpc_errors
    async def Detokenize(self, request: pb.DetokenizeRequest, context) -> pb.DetokenizeResponse:  # type: ignore[no-untyped-def]
        engine = self._engine()
        ids = validation.token_ids(request.ids, engine.limits, "ids")
        return pb.DetokenizeResponse(text=engine.runner.detokenize(list(ids), request.render_special))

    @rpc_errors
    async def GetModelInfo(self, request: pb.GetModelInfoRequest, context) -> pb.ModelInfo:  # type: ignore[no-untyped-def]
        engine = self._engine()
        meta, config, snap = engine.meta, engine.config, engine.executor.snapshot
        return pb.ModelInfo(
            name=meta.name,
            path=meta.path,
            architecture=meta.architecture,
            num_parameters=meta.num_parameters,
            n_ctx_train=meta.n_ctx_train,
            n_ctx=config.n_ctx,
            n_ctx_per_slot=config.n_ctx_per_slot,
            n_embd=meta.n_embd,
            vocab_size=meta.vocab_size,
            bos_token_id=meta.bos_token_id,
            eos_token_id=meta.eos_token_id,
            eog_token_ids=meta.eog_token_ids,
            has_chat_template=meta.chat_template is not None,
            can_generate=True,
            can_embed=config.embeddings,
            n_parallel=config.n_parallel,
            n_batch=config.n_batch_effective,
            n_ubatch=config.n_ubatch,
            pooling_type=engine.pooling,
            version=engine.version,
            slots=[pb.SlotInfo(seq_id=s.seq_id, busy=s.busy, num_cached_tokens=s.num_cached_tokens) for s in snap.slots],
            num_sessions_waiting=snap.num_waiting,
        )


def _turn_end(event: TurnEndEvent) -> pb.TurnEnd:
    decode_s = event.decode_ms / 1000.0
    tps = (event.completion_tokens - 1) / decode_s if decode_s > 0 and event.completion_tokens > 1 else 0.0
    return pb.TurnEnd(
        finish_reason=int(event.finish_reason),
        matched_stop=event.matched_stop,
        usage=pb.Usage(
            prompt_tokens=event.prompt_tokens,
            cached_tokens=event.cached_tokens,
            completion_tokens=event.completion_tokens,
        ),
        timings=pb.Timings(
            queue_ms=event.queue_ms,
            time_to_first_token_ms=event.ttft_ms,
            prompt_ms=event.prompt_ms,
            decode_ms=event.decode_ms,
            decode_tokens_per_second=tps,
        ),
        seed=event.seed,
        message=event.message,
    )


