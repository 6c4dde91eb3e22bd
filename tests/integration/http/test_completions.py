"""/v1/completions through the official `openai` SDK, against the real server and model.

Greedy text is compared only between calls that run alike: a first call warms the slot's
prefix cache, and the calls compared then both reuse it (numerics depend on batch shape
and KV layout)."""

from __future__ import annotations

import time

import pytest
from llmserve.client import Client
from openai import BadRequestError, OpenAI

from harness.server import RunningServer

from .conftest import API_KEY

PROMPT = "The lighthouse keeper looked at the storm and"


def _complete(client: OpenAI, model: str, prompt: object = PROMPT, **kwargs: object):  # type: ignore[no-untyped-def]
    return client.completions.create(model=model, prompt=prompt, **kwargs)  # type: ignore[call-overload]


def _streamed(client: OpenAI, model: str, prompt: object = PROMPT, **kwargs: object) -> list:  # type: ignore[type-arg]
    return list(_complete(client, model, prompt, stream=True, **kwargs))


def test_whole_and_streamed_agree_when_greedy(client: OpenAI, model: str) -> None:
    _complete(client, model, temperature=0, max_tokens=12)  # warms the prefix cache
    whole = _complete(client, model, temperature=0, max_tokens=12)
    chunks = _streamed(client, model, temperature=0, max_tokens=12)
    choice = whole.choices[0]
    assert whole.object == "text_completion" and whole.id.startswith("cmpl-") and whole.model == model
    assert choice.index == 0 and choice.text and choice.finish_reason in ("stop", "length") and choice.logprobs is None
    assert "".join(c.choices[0].text for c in chunks) == choice.text
    assert chunks[-1].choices[0].finish_reason == choice.finish_reason
    assert len({c.id for c in chunks}) == 1 and all(c.object == "text_completion" for c in chunks)
    assert whole.usage.completion_tokens <= 12 and whole.usage.prompt_tokens > 5


def test_max_tokens_and_usage_chunk(client: OpenAI, model: str) -> None:
    reply = _complete(client, model, max_tokens=5, extra_body={"ignore_eos": True})
    assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 5
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 5
    chunks = _streamed(client, model, max_tokens=4, stream_options={"include_usage": True},
                       extra_body={"ignore_eos": True})
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 4
    assert all(c.usage is None for c in chunks[:-1])


def test_a_stop_string_ends_the_text_before_it(client: OpenAI, model: str) -> None:
    _complete(client, model, temperature=0, max_tokens=24)
    text = _complete(client, model, temperature=0, max_tokens=24).choices[0].text
    words = text.split()
    assert len(words) > 4, text
    stopped = _complete(client, model, temperature=0, max_tokens=24, stop=[words[3], "never-there"])
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].text == text[: text.index(words[3])]
    streamed = _streamed(client, model, temperature=0, max_tokens=24, stop=words[3])
    assert "".join(c.choices[0].text for c in streamed) == stopped.choices[0].text  # never streamed


def test_a_list_of_prompts_gives_choices_in_order(client: OpenAI, model: str) -> None:
    prompts = ["1, 2, 3, 4, 5, 6,", "A, B, C, D, E, F,", "Monday, Tuesday, Wednesday,"]
    nexts = ["7", "G", "Thursday"]  # each prompt's obvious continuation: choice i answers prompt i // n
    alone = [_complete(client, model, p, max_tokens=1).usage.prompt_tokens for p in prompts]
    reply = _complete(client, model, prompts, n=2, max_tokens=3, temperature=0, extra_body={"ignore_eos": True})
    assert [c.index for c in reply.choices] == list(range(6))
    assert all(c.finish_reason == "length" for c in reply.choices)
    assert [nexts[i // 2] in c.text for i, c in enumerate(reply.choices)] == [True] * 6, reply.choices
    assert reply.usage.prompt_tokens == sum(alone) and reply.usage.completion_tokens == 18
    chunks = _streamed(client, model, prompts, max_tokens=3, extra_body={"ignore_eos": True})
    finishes = {c.choices[0].index: c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason}
    assert finishes == {0: "length", 1: "length", 2: "length"}


def test_token_id_prompts_are_the_text_prompts_tokens(client: OpenAI, model: str, http_server: RunningServer) -> None:
    with Client(http_server.address, api_key=API_KEY) as grpc_client:
        ids = grpc_client.tokenize(PROMPT)  # with BOS, as a text prompt is tokenized
    _complete(client, model, temperature=0, max_tokens=8)
    text = _complete(client, model, temperature=0, max_tokens=8)
    by_ids = _complete(client, model, ids, temperature=0, max_tokens=8)
    assert by_ids.usage.prompt_tokens == text.usage.prompt_tokens == len(ids)
    assert by_ids.choices[0].text == text.choices[0].text
    two = _complete(client, model, [ids, ids[:4]], max_tokens=2)
    assert [c.index for c in two.choices] == [0, 1] and two.usage.prompt_tokens == len(ids) + 4
    with pytest.raises(BadRequestError) as refused:
        _complete(client, model, [ids, [1, 10**9]], max_tokens=2)
    assert refused.value.body["param"] == "prompt[1]" and "outside the vocabulary" in refused.value.message


def test_echo(client: OpenAI, model: str, http_server: RunningServer) -> None:
    reply = _complete(client, model, echo=True, max_tokens=4, extra_body={"ignore_eos": True})
    assert reply.choices[0].text.startswith(PROMPT) and len(reply.choices[0].text) > len(PROMPT)
    chunks = _streamed(client, model, echo=True, max_tokens=4, extra_body={"ignore_eos": True})
    assert chunks[0].choices[0].text.startswith(PROMPT)
    with Client(http_server.address, api_key=API_KEY) as grpc_client:
        ids = grpc_client.tokenize(PROMPT, add_special=False)
    assert _complete(client, model, ids, echo=True, max_tokens=2).choices[0].text.startswith(PROMPT)


def test_logprobs_legacy_shape(client: OpenAI, model: str) -> None:
    reply = _complete(client, model, max_tokens=5, logprobs=3, extra_body={"ignore_eos": True})
    choice = reply.choices[0]
    lp = choice.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 5
    assert "".join(lp.tokens) == choice.text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(5)]
    for logprob, top in zip(lp.token_logprobs, lp.top_logprobs, strict=True):
        assert logprob <= 0 and 1 <= len(top) <= 3 and logprob <= max(top.values()) + 1e-6
    echoed = _complete(client, model, max_tokens=3, logprobs=1, echo=True, extra_body={"ignore_eos": True})
    lp = echoed.choices[0].logprobs
    num_prompt = echoed.usage.prompt_tokens - 1  # all but the first (BOS): nothing before it scores it
    assert len(lp.tokens) == num_prompt + 3
    assert lp.text_offset[num_prompt] == len(PROMPT) and lp.text_offset[num_prompt - 1] < len(PROMPT)
    assert "".join(lp.tokens[:num_prompt]) == PROMPT and all(v <= 0 for v in lp.token_logprobs)
    scored = _complete(client, model, max_tokens=0, logprobs=1, echo=True)  # the prompt's logprobs only
    assert scored.choices[0].text == PROMPT and scored.usage.completion_tokens == 0
    assert scored.choices[0].logprobs.tokens == lp.tokens[:num_prompt]
    assert scored.choices[0].finish_reason == "length"
    streamed_scored = _streamed(client, model, max_tokens=0, echo=True)
    assert "".join(c.choices[0].text for c in streamed_scored) == PROMPT
    chunks = _streamed(client, model, max_tokens=3, logprobs=2, echo=True, extra_body={"ignore_eos": True})
    streamed = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    assert len(streamed) == num_prompt + 3 and "".join(streamed[:num_prompt]) == PROMPT
    assert chunks[0].choices[0].text.startswith(PROMPT) and len(chunks[0].choices[0].logprobs.tokens) > num_prompt


@pytest.mark.parametrize(("field", "value"), [("suffix", "the end"), ("best_of", 2), ("stream_options", {"x": 1})])
def test_a_field_not_served_is_refused_by_name(client: OpenAI, model: str, field: str, value: object) -> None:
    with pytest.raises(BadRequestError) as refused:
        _complete(client, model, max_tokens=2, **({"stream": True} if field == "stream_options" else {}),
                  extra_body={field: value})
    param = refused.value.body["param"]
    assert param == (field if field != "stream_options" else "stream_options.x")
    for kwargs, param in [({"temperature": -1}, "temperature"), ({"logprobs": 21}, "logprobs"),
                          ({"max_tokens": 10**6}, "max_tokens"), ({"prompt": []}, "prompt")]:
        with pytest.raises(BadRequestError) as refused:
            _complete(client, model, **{"max_tokens": 2, **kwargs})
        assert refused.value.body["param"] == param, refused.value.message


def test_a_disconnect_frees_every_prompts_slot(client: OpenAI, model: str, http_server: RunningServer) -> None:
    with Client(http_server.address, api_key=API_KEY) as grpc_client:
        def busy() -> int:
            return sum(slot.busy for slot in grpc_client.model_info().slots)

        stream = _complete(client, model, ["Count to 5000:", "List every number:"], stream=True, max_tokens=1500,
                           temperature=0, extra_body={"ignore_eos": True})
        for _, chunk in zip(range(6), stream):
            assert chunk.choices
        assert busy() == 2
        stream.close()
        deadline = time.monotonic() + 3.0
        while busy() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert busy() == 0


def test_the_same_seed_gives_generate_texts_tokens(client: OpenAI, model: str, http_server: RunningServer) -> None:
    """One engine path: the same prompt, seed and settings over HTTP and gRPC GenerateText."""
    settings = {"temperature": 0.9, "seed": 11, "max_tokens": 12, "top_p": 0.9}
    _complete(client, model, **settings, extra_body={"ignore_eos": True})  # warms the prefix cache
    reply = _complete(client, model, logprobs=0, **settings, extra_body={"ignore_eos": True})
    with Client(http_server.address, api_key=API_KEY) as grpc_client:
        grpc = grpc_client.generate_text(PROMPT, ignore_eos=True, logprobs=True, **settings).samples[0]
    assert reply.choices[0].text == grpc.text and reply.usage.completion_tokens == len(grpc.token_ids) == 12
    assert reply.choices[0].logprobs.token_logprobs == pytest.approx([lp.logprob for lp in grpc.logprobs], abs=1e-4)
