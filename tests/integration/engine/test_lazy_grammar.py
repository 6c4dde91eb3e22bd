"""A lazy grammar (model/grammar_compiler.py `CompiledGrammar(trigger_token=...)`), what a
native tool format's `tool_choice: auto` reply is held by: with the real vocabulary, the
sampler draws freely until the trigger token, then only what the grammar allows, and the
end of generation waits for the grammar to complete. The grammar compiler makes one from a
"tool_frames" document's `trigger` only when that text is one token."""

from __future__ import annotations

import json

import numpy as np
import pytest
from llmserve.service.domain.errors import GrammarError
from llmserve.service.domain.requests import SamplingParams
from llmserve.service.model.default_model import default_model_path
from llmserve.service.model.grammar_compiler import CompiledGrammar, GrammarCompiler
from llmserve.service.model.sampler import Sampler
from llmserve.service.model.tokenizer import Vocab, load_model

TRIGGER = "<start_of_image>"  # one token of gemma-3's vocabulary (none of the tool tags is)
GBNF = f'root ::= "{TRIGGER}" [0-9] [0-9]*\n'


@pytest.fixture(scope="module")
def vocab() -> Vocab:
    return Vocab(load_model(default_model_path()))


def _row(vocab: Vocab, token: int) -> np.ndarray:
    row = np.random.default_rng(token).standard_normal(vocab.n_tokens).astype(np.float32)
    row[token] = 40.0
    return row


def test_the_output_is_free_until_the_trigger_then_held(vocab: Vocab) -> None:
    [trigger] = vocab.tokenize(TRIGGER, add_special=False, parse_special=True)
    [hello] = vocab.tokenize("hello", add_special=False, parse_special=False)
    compiled = CompiledGrammar(GBNF, vocab.ptr, trigger_token=trigger)
    sampler = Sampler(SamplingParams(temperature=0.0, seed=1, grammar=GBNF), vocab.ptr, vocab.n_tokens, 4096,
                      grammar=compiled)
    assert sampler.sample_from(_row(vocab, hello)) == hello  # not held yet: the grammar would refuse it
    assert sampler.grammar_allows_end()
    assert sampler.sample_from(_row(vocab, trigger)) == trigger
    assert not sampler.grammar_allows_end()  # held: a digit must come
    digit = sampler.sample_from(_row(vocab, hello))
    assert digit is not None and vocab.piece(digit).decode().isdigit()
    assert sampler.grammar_allows_end()
    sampler.begin_turn()  # a fresh clone: free again
    assert sampler.sample_from(_row(vocab, hello)) == hello
    sampler.free()


def test_the_compiler_makes_a_lazy_grammar_only_from_a_one_token_trigger(vocab: Vocab) -> None:
    compiler = GrammarCompiler(default_model_path(), vocab.ptr, 30.0, 256 << 20)
    try:
        frames = {"schema": {"type": "object"}, "opening": TRIGGER + "\n", "closing": "", "max_calls": 1,
                  "trigger": TRIGGER}
        compiled = compiler.compile("tool_frames", json.dumps(frames))
        assert compiled.gbnf.startswith("root ::= frame") or "root ::= frame" in compiled.gbnf
        sampler = Sampler(SamplingParams(temperature=0.0, seed=1, grammar=compiled.gbnf), vocab.ptr, vocab.n_tokens,
                          4096, grammar=compiled)
        [hello] = vocab.tokenize("hello", add_special=False, parse_special=False)
        assert sampler.sample_from(_row(vocab, hello)) == hello  # lazy: free before the trigger
        sampler.free()
        with pytest.raises(GrammarError, match="not one token"):
            compiler.compile("tool_frames", json.dumps({**frames, "opening": "<tool_call>\n", "trigger": "<tool_call>"}))
    finally:
        compiler.close()
