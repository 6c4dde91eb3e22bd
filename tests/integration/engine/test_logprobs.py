"""Logprobs: per token and top-N alternatives, equal to a numpy log-softmax of the logits."""

from __future__ import annotations

from pathlib import Path

import grpc
import numpy as np
from llmserve.client import make_input, pb
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc

PROMPT = "The chemical symbol for gold is"


def _run(address: str, config: pb.SessionConfig, prompt: str = PROMPT) -> list[pb.GenerateResponse]:
    request = pb.GenerateRequest(config=config, input=make_input(prompt), end_of_turn=True)
    with grpc.insecure_channel(address) as channel:
        return list(pb_grpc.LLMServiceStub(channel).Generate(iter([request]), timeout=60))


def _config(top: int, max_tokens: int = 6, prompt_logprobs: bool = False) -> pb.SessionConfig:
    return pb.SessionConfig(
        sampling=pb.SamplingParams(temperature=0),
        stopping=pb.StoppingCriteria(max_tokens=max_tokens, ignore_eos=True),
        output=pb.OutputOptions(top_logprobs=top, prompt_logprobs=prompt_logprobs),
    )


def _reference_first_token_logprobs(model_path: Path, prompt: str) -> np.ndarray:
    """log-softmax of llama_get_logits_ith for the prompt's last token, computed here."""
    import llama_cpp

    model = llama_cpp.llama_model_load_from_file(str(model_path).encode(), llama_cpp.llama_model_default_params())
    vocab = llama_cpp.llama_model_get_vocab(model)
    params = llama_cpp.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_threads, params.n_threads_batch = 512, 512, 2, 2
    ctx = llama_cpp.llama_init_from_model(model, params)
    try:
        data = prompt.encode()
        buf = (llama_cpp.llama_token * 64)()
        n = llama_cpp.llama_tokenize(vocab, data, len(data), buf, 64, True, True)
        batch = llama_cpp.llama_batch_get_one(buf, n)
        assert llama_cpp.llama_decode(ctx, batch) == 0
        n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(n_vocab,)).astype(np.float64)
    finally:
        llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)
    shifted = logits - logits.max()
    return shifted - np.log(np.exp(shifted).sum())


def test_token_logprobs_and_alternatives(server, model_path) -> None:  # type: ignore[no-untyped-def]
    responses = _run(server.address, _config(top=5))
    entries = [lp for r in responses if r.HasField("chunk") for lp in r.chunk.logprobs]
    ids = [t for r in responses if r.HasField("chunk") for t in r.chunk.token_ids]
    assert len(entries) == len(ids) == 6
    for token, lp in zip(ids, entries):
        assert lp.token_id == token
        assert lp.logprob <= 0
        assert len(lp.top) == 5
        values = [t.logprob for t in lp.top]
        assert values == sorted(values, reverse=True) and all(v <= 0 for v in values)
        assert lp.top[0].token_id == token  # greedy picks the argmax
        assert abs(lp.top[0].logprob - lp.logprob) < 1e-6
    # Like with like: the prompt's first use on this server, prefilled in one batch as the
    # reference's is, with the same kernels (flash attention, llama.cpp's "auto", in both);
    # the contexts differ only in KV size. Measured here: the same digits (-1.28480 both).
    reference = _reference_first_token_logprobs(model_path, PROMPT)
    first = entries[0]
    assert abs(first.logprob - reference[first.token_id]) < 1e-3
    expected_top = np.argsort(-reference)[:5]
    assert [t.token_id for t in first.top][:3] == list(expected_top[:3])
    for t in first.top:
        assert abs(t.logprob - reference[t.token_id]) < 1e-3
    print(f"first token logprob {first.logprob:.5f} vs numpy reference {reference[first.token_id]:.5f}")


def test_logprobs_only_when_asked_and_capped(server) -> None:  # type: ignore[no-untyped-def]
    plain = _run(server.address, pb.SessionConfig(stopping=pb.StoppingCriteria(max_tokens=3)))
    assert all(not r.chunk.logprobs for r in plain if r.HasField("chunk"))
    sampled_only = _run(server.address, _config(top=0, max_tokens=3))
    entries = [lp for r in sampled_only if r.HasField("chunk") for lp in r.chunk.logprobs]
    assert len(entries) == 3 and all(not lp.top for lp in entries)
    try:
        _run(server.address, _config(top=21))
        raise AssertionError("top_logprobs 21 accepted")
    except grpc.RpcError as err:
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_prompt_logprobs(server) -> None:  # type: ignore[no-untyped-def]
    prompt = "One two three four five six"
    responses = _run(server.address, _config(top=2, max_tokens=2, prompt_logprobs=True), prompt)
    scored = [lp for r in responses if r.HasField("prompt_logprobs") for lp in r.prompt_logprobs.tokens]
    end = responses[-1].turn_end
    assert len(scored) == end.usage.prompt_tokens - 1  # every token but the first (BOS)
    assert all(lp.logprob <= 0 and len(lp.top) == 2 for lp in scored)
    # A counting sequence is predictable: the later words are likelier than the first.
    assert scored[-1].logprob > scored[0].logprob
