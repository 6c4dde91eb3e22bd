"""/v1/completions and /v1/embeddings bodies (http/fields.py, completion_request.py) and the
legacy logprobs object (http/legacy_logprobs.py), without a server."""

from __future__ import annotations

import pytest
from llmserve.service.domain.events import PromptLogprobsEvent, TokenEvent, TokenLogprob
from llmserve.service.http.completion_request import parse_completion
from llmserve.service.http.embeddings import parse_embeddings
from llmserve.service.http.errors import ApiError
from llmserve.service.http.legacy_logprobs import LegacyLogprobs

PIECES = {1: "Hel", 2: "lo", 3: " wor", 4: "ld", 5: "!"}


def _lp(token: int, logprob: float, *alternatives: int) -> TokenLogprob:
    return TokenLogprob(token, logprob, tuple((t, PIECES[t], logprob - i) for i, t in enumerate(alternatives)))


def test_prompt_shapes() -> None:
    assert parse_completion({"prompt": "a"}).prompts == ["a"]
    assert parse_completion({"prompt": ["a", "b"]}).prompts == ["a", "b"]
    assert parse_completion({"prompt": [1, 2]}).prompts == [[1, 2]]
    assert parse_completion({"prompt": [[1], [2, 3]]}).prompts == [[1], [2, 3]]
    assert parse_embeddings({"input": [[1], "x"]}).inputs == [[1], "x"]


@pytest.mark.parametrize(("body", "param"), [
    ({"prompt": ["a", ""]}, "prompt[1]"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": [True]}, "prompt"),
    ({"prompt": "a", "suffix": "b"}, "suffix"),
    ({"prompt": "a", "best_of": 2}, "best_of"),
    ({"prompt": "a", "echo": 1}, "echo"),
    ({"prompt": "a", "stream_options": {"include_usage": True}}, "stream_options"),
    ({}, "prompt"),
])
def test_completion_refusals_name_the_field(body: dict[str, object], param: str) -> None:
    with pytest.raises(ApiError) as refused:
        parse_completion(body)
    assert refused.value.status == 400 and refused.value.param == param


def test_max_tokens_zero_runs_one_token_shown_as_none() -> None:
    request = parse_completion({"prompt": "a", "max_tokens": 0})
    assert request.prompt_only and request.stopping["max_tokens"] == 1
    assert parse_completion({"prompt": "a"}).stopping["max_tokens"] == 16  # OpenAI's default


def test_legacy_logprobs_offsets_count_the_echoed_prompt() -> None:
    logprobs = LegacyLogprobs(PIECES.__getitem__, echoed_prompt="Hello")
    logprobs.add_prompt(PromptLogprobsEvent((_lp(2, -1.0, 2, 1),)))  # "Hel" (first) is not scored
    logprobs.add(TokenEvent(" wor", (3,), (_lp(3, -0.5, 3),)))
    first = logprobs.take()
    logprobs.add(TokenEvent("ld!", (4, 5), (_lp(4, -0.25), _lp(5, -2.0, 1))))
    assert first == {"tokens": ["lo", " wor"], "token_logprobs": [-1.0, -0.5],
                     "top_logprobs": [{"lo": -1.0, "Hel": -2.0}, {" wor": -0.5}], "text_offset": [3, 5]}
    assert logprobs.take() == {"tokens": ["ld", "!"], "token_logprobs": [-0.25, -2.0],
                               "top_logprobs": [{}, {"Hel": -2.0}], "text_offset": [9, 11]}
    assert logprobs.whole()["text_offset"] == [3, 5, 9, 11]
    assert logprobs.take() is None
