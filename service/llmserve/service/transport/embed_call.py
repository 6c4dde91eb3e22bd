"""One Embed call: bounded read-ahead in, results out in input order.

The reader tokenizes and validates each input and submits it to the executor,
but never has more than `WINDOW` inputs in flight: a client streaming millions
of documents keeps server memory flat, and gRPC flow control holds the rest.
Text is tokenized with the embedding model's own vocabulary, token ids are checked
against it. An input over the embedding model's `max_input_tokens` is INVALID_ARGUMENT
naming its index and both sizes, or is cut when `options.truncate` asks (the engine's
rule: `Engine.embed_input`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from llmserve.v1 import llmserve_pb2 as pb

from ..domain.events import EmbedResult, SessionFailed
from ..engine.engine import Engine, LoopSink
from .errors import FailedPrecondition, InvalidArgument, check_decoded, error_from_failure
from .inputs import input_tokens
from .tracing import note_embed
from .validation import MAX_EMBED_INPUTS_PER_MESSAGE

WINDOW = 256


class _ReaderDone:
    def __init__(self, num_inputs: int) -> None:
        self.num_inputs = num_inputs


class _ReaderFailed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class EmbedCall:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    async def run(self, requests: AsyncIterator[pb.EmbedRequest]) -> AsyncIterator[EmbedResult]:
        if self.engine.embedding_model is None:
            raise FailedPrecondition("this server was started without --embeddings")
        sink = LoopSink(asyncio.get_running_loop())
        window = asyncio.Semaphore(WINDOW)
        reader = asyncio.create_task(self._read(requests, sink, window))
        ready: dict[int, EmbedResult] = {}
        next_index = 0
        total: int | None = None
        try:
            while total is None or next_index < total:
                event = await sink.get()
                if isinstance(event, EmbedResult):
                    note_embed(event)
                    ready[event.index] = event
                    while next_index in ready:
                        yield ready.pop(next_index)
                        next_index += 1
                        window.release()
                elif isinstance(event, _ReaderDone):
                    total = event.num_inputs
                elif isinstance(event, SessionFailed):
                    raise error_from_failure(event.kind, event.message)
                elif isinstance(event, _ReaderFailed):
                    raise event.error
        finally:
            reader.cancel()
            self.engine.drop_embeds(sink)  # a cancelled call leaves no work behind

    async def _read(
        self, requests: AsyncIterator[pb.EmbedRequest], sink: LoopSink, window: asyncio.Semaphore
    ) -> None:
        normalize, truncate, add_special = True, False, True
        index = 0
        try:
            async for request in requests:
                request = check_decoded(request)
                if request.HasField("options"):
                    opts = request.options
                    normalize = opts.normalize if opts.HasField("normalize") else True
                    add_special = opts.add_bos if opts.HasField("add_bos") else True
                    truncate = opts.truncate
                if len(request.inputs) > MAX_EMBED_INPUTS_PER_MESSAGE:
                    raise InvalidArgument(
                        f"{len(request.inputs)} inputs in one message; the limit is {MAX_EMBED_INPUTS_PER_MESSAGE}",
                        field="inputs",
                    )
                for j, item in enumerate(request.inputs):
                    tokens = await input_tokens(self.engine, item, f"inputs[{j}]", add_special, embedding_model=True)
                    added_specials = item.WhichOneof("kind") == "text" and add_special
                    one = self.engine.embed_input(index, tokens, f"inputs[{j}]", normalize, truncate, added_specials)
                    await window.acquire()
                    self.engine.embed((one,), sink)
                    index += 1
            sink.put_local(_ReaderDone(index))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the writer maps it to a status
            sink.put_local(_ReaderFailed(exc))
