"""One Embed call: bounded read-ahead in, results out in input order.

The reader tokenizes and validates each input and submits it to the executor,
but never has more than `WINDOW` inputs in flight: a client streaming millions
of documents keeps server memory flat, and gRPC flow control holds the rest.
Text is tokenized with the embedding model's own vocabulary, token ids are checked
against it. Every input must fit one ubatch (llama.cpp aborts the process otherwise)
and the model's trained context (a learned position table ends there), so an
oversize input is INVALID_ARGUMENT naming its index and both sizes, or is cut to
`max_input_tokens` when the request asks to truncate.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from llmserve.v1 import llmserve_pb2 as pb

from ..domain.events import EmbedResult, SessionFailed
from ..domain.model_meta import EmbeddingModelInfo
from ..domain.requests import EmbedInput
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
        embedder = self.engine.embedding_model
        if embedder is None:
            raise FailedPrecondition("this server was started without --embeddings")
        sink = LoopSink(asyncio.get_running_loop())
        window = asyncio.Semaphore(WINDOW)
        reader = asyncio.create_task(self._read(embedder, requests, sink, window))
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
        self, embedder: EmbeddingModelInfo, requests: AsyncIterator[pb.EmbedRequest], sink: LoopSink, window: asyncio.Semaphore
    ) -> None:
        max_tokens = embedder.max_input_tokens
        limit = "one ubatch, the model's trained context" if max_tokens == embedder.meta.n_ctx_train else "one ubatch"
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
                    truncated = len(tokens) > max_tokens
                    if truncated and not truncate:
                        raise InvalidArgument(
                            f"input {index} has {len(tokens)} tokens, more than the {max_tokens} an embedding "
                            f"input may have ({limit}); split it or set options.truncate",
                            field=f"inputs[{j}]",
                        )
                    if truncated:
                        tokens = _truncate(tokens, embedder, item.WhichOneof("kind") == "text" and add_special)
                    await window.acquire()
                    self.engine.embed((EmbedInput(index, tokens, normalize, truncated),), sink)
                    index += 1
            sink.put_local(_ReaderDone(index))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the writer maps it to a status
            sink.put_local(_ReaderFailed(exc))


def _truncate(tokens: tuple[int, ...], embedder: EmbeddingModelInfo, added_specials: bool) -> tuple[int, ...]:
    """Cut to `max_input_tokens`, keeping a closing SEP/EOS the tokenizer added (as
    sentence-transformers' truncation does for BERT)."""
    max_tokens = embedder.max_input_tokens
    if added_specials and embedder.adds_eos and tokens[-1] == embedder.eos_token_id:
        return tokens[: max_tokens - 1] + (tokens[-1],)
    return tokens[:max_tokens]
