"""/v1/chat/completions through the official `openai` SDK, against the real server and model.

Greedy text is compared only between calls that run alike: a first call warms the slot's
prefix cache, and the calls compared then both reuse it (numerics depend on
batch shape and KV layout)."""

from __future__ import annotations

import uuid

from openai import OpenAI

PROMPT = [{"role": "user", "content": "Write a short story about a lighthouse keeper and a storm."}]


def _text(client: OpenAI, model: str, **kwargs: object) -> tuple[str, str]:
    reply = client.chat.completions.create(model=model, messages=PROMPT, **kwargs)  # type: ignore[call-overload]
    return reply.choices[0].message.content, reply.choices[0].finish_reason


def _streamed(client: OpenAI, model: str, **kwargs: object) -> tuple[str, list]:  # type: ignore[type-arg]
    chunks = list(client.chat.completions.create(model=model, messages=PROMPT, stream=True, **kwargs))  # type: ignore[call-overload]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, chunks


def test_models_lists_the_alias_and_the_file(client: OpenAI) -> None:
    models = client.models.list()
    ids = [m.id for m in models.data]
    assert ids == ["gemma-3-270m-q4_k_m", "gemma-3-270m-q4_k_m.gguf"]  # the alias (the file's stem), the file
    assert all(m.object == "model" and m.owned_by == "llmserve" for m in models.data)
    assert client.models.list().data[0].id == ids[0]


def test_whole_and_streamed_replies_agree_when_greedy(client: OpenAI, model: str) -> None:
    _text(client, model, temperature=0, max_tokens=24)  # warms the prefix cache
    whole, finish = _text(client, model, temperature=0, max_tokens=24)
    streamed, chunks = _streamed(client, model, temperature=0, max_tokens=24)
    assert whole and streamed == whole
    assert finish in ("stop", "length")
    first, last = chunks[0], chunks[-1]
    assert first.choices[0].delta.role == "assistant" and first.object == "chat.completion.chunk"
    assert last.choices[0].finish_reason == finish and not last.choices[0].delta.content
    assert len({c.id for c in chunks}) == 1 and first.id.startswith("chatcmpl-")
    assert all(c.usage is None for c in chunks)  # not asked for


def test_a_seed_repeats(client: OpenAI, model: str) -> None:
    _text(client, model, temperature=0.9, seed=7, max_tokens=16)
    first = _text(client, model, temperature=0.9, seed=7, max_tokens=16)
    assert _text(client, model, temperature=0.9, seed=7, max_tokens=16) == first


def test_usage_chunk_when_asked(client: OpenAI, model: str) -> None:
    _, chunks = _streamed(client, model, max_tokens=6, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == [] and usage_chunk.usage.completion_tokens == 6
    assert usage_chunk.usage.total_tokens == usage_chunk.usage.prompt_tokens + 6
    assert all(c.usage is None for c in chunks[:-1])
    assert chunks[-2].choices[0].finish_reason == "length"


def test_max_tokens_ends_with_length(client: OpenAI, model: str) -> None:
    reply = client.chat.completions.create(model=model, messages=PROMPT, max_completion_tokens=5,
                                           extra_body={"ignore_eos": True})
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 5
    assert reply.object == "chat.completion" and reply.system_fingerprint.startswith("llmserve-")
    assert reply.model == model and reply.choices[0].message.role == "assistant"


def test_a_stop_string_ends_the_reply_before_it(client: OpenAI, model: str) -> None:
    _text(client, model, temperature=0, max_tokens=32)
    text, _ = _text(client, model, temperature=0, max_tokens=32)
    words = text.split()
    assert len(words) > 4, text
    stop = words[3]
    stopped, finish = _text(client, model, temperature=0, max_tokens=32, stop=[stop, "never-there"])
    assert finish == "stop"
    assert stopped == text[: text.index(stop)]
    streamed, _ = _streamed(client, model, temperature=0, max_tokens=32, stop=stop)
    assert streamed == stopped  # a stop string is never streamed


def test_n_samples(client: OpenAI, model: str) -> None:
    reply = client.chat.completions.create(model=model, messages=PROMPT, n=2, max_tokens=8, seed=3,
                                           extra_body={"ignore_eos": True})
    assert [c.index for c in reply.choices] == [0, 1]
    assert all(c.finish_reason == "length" and c.message.content for c in reply.choices)
    assert reply.usage.completion_tokens == 16
    _, chunks = _streamed(client, model, n=2, max_tokens=8, extra_body={"ignore_eos": True})
    finishes = {c.choices[0].index: c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason}
    assert finishes == {0: "length", 1: "length"}


def test_logprobs_and_top_logprobs(client: OpenAI, model: str) -> None:
    reply = client.chat.completions.create(model=model, messages=PROMPT, max_tokens=5, logprobs=True, top_logprobs=3,
                                           extra_body={"ignore_eos": True})
    content = reply.choices[0].logprobs.content
    assert len(content) == 5
    assert "".join(t.token for t in content) == reply.choices[0].message.content
    for token in content:
        assert token.logprob <= 0 and bytes(token.bytes) == token.token.encode()
        tops = [t.logprob for t in token.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True) and token.logprob <= tops[0] + 1e-6
    plain = client.chat.completions.create(model=model, messages=PROMPT, max_tokens=2)
    assert plain.choices[0].logprobs is None
    _, chunks = _streamed(client, model, max_tokens=3, logprobs=True, extra_body={"ignore_eos": True})
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert len(streamed) == 3 and all(t.top_logprobs == [] for t in streamed)


def test_a_repeated_prefix_is_cached(client: OpenAI, model: str) -> None:
    system = {"role": "system", "content": f"You are a careful assistant {uuid.uuid4().hex}. " * 8}
    first = client.chat.completions.create(model=model, max_tokens=2,
                                           messages=[system, {"role": "user", "content": "Say hi."}])
    second = client.chat.completions.create(model=model, max_tokens=2,
                                            messages=[system, {"role": "user", "content": "Say bye."}])
    assert first.usage.prompt_tokens_details.cached_tokens < 20
    assert second.usage.prompt_tokens_details.cached_tokens >= 100  # the whole system prompt at least
    assert second.usage.prompt_tokens_details.cached_tokens < second.usage.prompt_tokens


def test_text_parts_and_a_conversation(client: OpenAI, model: str) -> None:
    messages = [
        {"role": "system", "content": [{"type": "text", "text": "Answer in one word."}]},
        {"role": "user", "content": [{"type": "text", "text": "Capital of "}, {"type": "text", "text": "France?"}]},
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "And of Italy?"},
    ]
    reply = client.chat.completions.create(model=model, messages=messages, max_tokens=8,  # type: ignore[arg-type]
                                           temperature=0, top_p=0.9, presence_penalty=0.1, frequency_penalty=0.1,
                                           user="u-1", logit_bias={"0": -100},
                                           extra_body={"top_k": 20, "min_p": 0.01, "typical_p": 1.0,
                                                       "repeat_penalty": 1.1, "min_tokens": 1})
    assert reply.choices[0].message.content and reply.usage.prompt_tokens > 20


def test_a_developer_message_is_a_system_message(client: OpenAI, model: str) -> None:
    def prompt_tokens(role: str) -> int:
        messages = [{"role": role, "content": "Answer in one word."}, {"role": "user", "content": "Capital of France?"}]
        reply = client.chat.completions.create(model=model, messages=messages, max_tokens=1)  # type: ignore[arg-type]
        return reply.usage.prompt_tokens

    assert prompt_tokens("developer") == prompt_tokens("system")  # rendered alike (refused before: a 400)
