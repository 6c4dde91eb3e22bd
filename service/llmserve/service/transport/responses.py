"""Domain values → protobuf messages: every response the service builds.

(The other direction, requests → domain values, is validation.py: it checks as it
converts.)
"""

from __future__ import annotations

from llmserve.v1 import llmserve_pb2 as pb

from ..domain.events import EmbedResult, TokenLogprob, TurnEndEvent
from ..domain.model_meta import EmbeddingModelInfo
from ..domain.request_rules import MAX_TOP_LOGPROBS
from ..engine.engine import Engine
from ..turn_record import tokens_per_second
from .adapters import adapter_infos


def logprob_proto(lp: TokenLogprob) -> pb.TokenLogprob:
    return pb.TokenLogprob(
        token_id=lp.token_id,
        logprob=lp.logprob,
        top=[pb.TopLogprob(token_id=t, text=text, logprob=v) for t, text, v in lp.top],
    )


def turn_end_proto(event: TurnEndEvent) -> pb.TurnEnd:
    return pb.TurnEnd(
        finish_reason=int(event.finish_reason),
        matched_stop=event.matched_stop,
        usage=pb.Usage(
            prompt_tokens=event.prompt_tokens,
            cached_tokens=event.cached_tokens,
            completion_tokens=event.completion_tokens,
            draft_tokens=event.draft_tokens,
            accepted_draft_tokens=event.accepted_draft_tokens,
        ),
        timings=pb.Timings(
            queue_ms=event.queue_ms,
            time_to_first_token_ms=event.ttft_ms,
            prompt_ms=event.prompt_ms,
            decode_ms=event.decode_ms,
            decode_tokens_per_second=tokens_per_second(event),
        ),
        seed=event.seed,
        message=event.message,
        index=event.index,
        matched_stop_token_id=event.matched_stop_token_id,
        tool_calls=[pb.ToolCall(id=c.id, name=c.name, arguments=c.arguments) for c in event.tool_calls],
    )


def embed_response(result: EmbedResult) -> pb.EmbedResponse:
    return pb.EmbedResponse(
        index=result.index,
        embedding=result.vector.tolist(),
        num_tokens=result.num_tokens,
        truncated=result.truncated,
    )


def model_info(engine: Engine, max_queue: int, models: list[str]) -> pb.ModelInfo:
    """`engine`'s model; `models`: every generative model's name, the default first."""
    meta, config, snap = engine.meta, engine.config, engine.snapshot
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
        can_generate=engine.generates,
        can_embed=engine.embedding_model is not None,
        n_parallel=config.n_parallel,
        n_batch=config.n_batch_effective,
        n_ubatch=config.n_ubatch,
        n_swa=meta.n_swa,
        pooling_type=engine.pooling,
        version=engine.version,
        models=models,
        slots=[
            pb.SlotInfo(
                seq_id=s.seq_id, busy=s.busy, num_cached_tokens=s.num_cached_tokens, paused=s.paused,
                kv_pos_min=s.kv_pos_min, kv_pos_max=s.kv_pos_max,
            )
            for s in snap.slots
        ],
        num_sessions_waiting=snap.num_waiting,
        max_queue=max_queue,
        adapters=adapter_infos(engine),
        features=_features(engine),
        embedding_model=_embedding_model_info(engine.embedding_model),
    )


def _features(engine: Engine) -> pb.Features:
    """What `engine` serves beyond plain generation."""
    return pb.Features(
        samplers=engine.samplers,
        max_top_logprobs=MAX_TOP_LOGPROBS,
        prompt_logprobs=True,
        grammar=True,
        json_schema=True,
        regex=True,
        choice=True,
        json_object=True,
        strict=True,  # Constraint.strict: domain/schema_strict.py
        tools=engine.chat_template is not None,  # tools need chat messages
        chat=engine.chat_template is not None,
        chat_template_source=engine.chat_template.origin if engine.chat_template else "",
        max_samples=engine.limits.max_samples,
    )


def _embedding_model_info(info: EmbeddingModelInfo | None) -> pb.EmbeddingModelInfo | None:
    if info is None:
        return None
    meta = info.meta
    return pb.EmbeddingModelInfo(
        name=meta.name,
        path=meta.path,
        architecture=meta.architecture,
        num_parameters=meta.num_parameters,
        n_ctx_train=meta.n_ctx_train,
        n_embd=info.n_embd,
        vocab_size=meta.vocab_size,
        pooling_type=info.pooling,
        max_input_tokens=info.max_input_tokens,
        n_ubatch=info.n_ubatch,
        separate=info.separate,
    )


def text_response(responses: list[pb.GenerateResponse]) -> pb.GenerateTextResponse:
    """A one-turn session's responses, gathered: each sample's whole text and turn end."""
    reply = pb.GenerateTextResponse()
    texts: dict[int, list[str]] = {}
    samples: dict[int, pb.GenerateTextResponse.Sample] = {}
    for response in responses:
        reply.request_id = response.request_id
        kind = response.WhichOneof("event")
        if kind == "chunk":
            chunk = response.chunk
            sample = samples.setdefault(chunk.index, pb.GenerateTextResponse.Sample(index=chunk.index))
            texts.setdefault(chunk.index, []).append(chunk.text)
            sample.token_ids.extend(chunk.token_ids)
            sample.logprobs.extend(chunk.logprobs)
        elif kind == "turn_end":
            end = response.turn_end
            samples.setdefault(end.index, pb.GenerateTextResponse.Sample(index=end.index)).turn_end.CopyFrom(end)
        elif kind == "prompt_logprobs":
            reply.prompt_logprobs.tokens.extend(response.prompt_logprobs.tokens)
    for index, sample in sorted(samples.items()):
        sample.text = "".join(texts.get(index, []))
        reply.samples.append(sample)
    return reply
