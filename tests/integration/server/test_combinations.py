"""Features that landed since Reliability II, together (issue 26 §5): each worked alone.

- speculation x grammar x n > 1 x logprobs, and with a named session over two streams
  (a named session takes one sample per turn);
- `-kvu` x a sliding window whose cells other slots took x a named session reopened;
- a context shift in the middle of speculation.

Each checks the content, not only the status: the grammar holds, every token carries
exactly `top_logprobs` alternatives, each sample ends once, the cached prefix grows, a
reopened session continues from its saved history, and llama.cpp's KV holds exactly
what the slots mirror (`kv_leaks`, tests/soak/server_state.py)."""

from __future__ import annotations

import re
from pathlib import Path

import grpc
from llmserve.client import Client, pb

from harness.metrics import metric
from harness.server import start_server, stop_server
from tests.greedy import parting
from tests.helpers import SessionStream
from tests.soak.server_state import kv_leaks

PASSAGE = "Alice sent the report on Monday. Bob read the report on Tuesday. Carol signed the report on Friday."
COPY = f"Text:\n{PASSAGE}\nRepeat the text above exactly.\nText:\n"
GRAMMAR = 'root ::= "Alice" [a-zA-Z .]*'
TOP = 2


def _read_samples(stream: SessionStream, n: int) -> dict[int, tuple[str, list[pb.TokenLogprob], list[pb.TurnEnd]]]:
    """One turn of `n` samples: text, logprobs and turn ends by sample index."""
    samples: dict[int, tuple[str, list[pb.TokenLogprob], list[pb.TurnEnd]]] = {i: ("", [], []) for i in range(n)}
    finals = 0
    while finals < 1:
        response = stream.next_response()
        if response.HasField("chunk"):
            text, logprobs, ends = samples[response.chunk.index]
            assert len(response.chunk.logprobs) == len(response.chunk.token_ids)
            samples[response.chunk.index] = (text + response.chunk.text, logprobs + list(response.chunk.logprobs), ends)
        elif response.HasField("turn_end"):
            samples[response.turn_end.index][2].append(response.turn_end)
            finals += all(samples[i][2] for i in range(n))
    return samples


def _check_turn(samples, max_tokens: int) -> int:  # type: ignore[no-untyped-def]
    """Every sample ended once within max_tokens, its text in the grammar, every token with
    exactly TOP alternatives. Returns the drafts the turn proposed."""
    drafts = 0
    for index, (text, logprobs, ends) in samples.items():
        assert len(ends) == 1, f"sample {index}: {len(ends)} turn ends"
        end = ends[0]
        assert end.finish_reason in (pb.FINISH_REASON_STOP, pb.FINISH_REASON_LENGTH), end
        assert len(logprobs) == end.usage.completion_tokens <= max_tokens
        assert all(len(lp.top) == TOP for lp in logprobs), "a token without exactly top_logprobs alternatives"
        assert re.fullmatch(r"Alice[a-zA-Z .]*", text), text
        drafts += end.usage.draft_tokens
    return drafts


def test_speculation_grammar_samples_logprobs_and_a_named_session(tmp_path: Path) -> None:
    """n = 2 on a multi-turn stream, then (named sessions take one sample) the same with
    n = 1 as a named session over two streams; drafts, the grammar and logprobs throughout."""
    running = start_server(["-np", "4", "-c", "8192", "-t", "2", "--spec-type", "ngram-simple",
                            "--session-dir", str(tmp_path / "sessions")], tmp_path / "server.log")
    config = dict(max_tokens=40, temperature=0.3, seed=5, top_logprobs=TOP, grammar=GRAMMAR)
    try:
        with grpc.insecure_channel(running.address) as channel, Client(running.address, timeout=300) as client:
            drafts = 0
            for n, session_id in ((2, ""), (1, "combo")):
                first = SessionStream(channel, timeout=300, n=n, session_id=session_id, **config)  # type: ignore[arg-type]
                first.send(COPY)
                turn1 = _read_samples(first, n)
                drafts += _check_turn(turn1, 40)
                first.send("\nRepeat it once more.\nText:\n")
                turn2 = _read_samples(first, n)
                drafts += _check_turn(turn2, 40)
                end1, end2 = turn1[0][2][0], turn2[0][2][0]
                assert end2.usage.cached_tokens >= end1.usage.prompt_tokens + end1.usage.completion_tokens - 1
                first.close()
                assert list(first.call) == []
            history = sum(e.usage.prompt_tokens + e.usage.completion_tokens for e in (end1, end2))
            second = SessionStream(channel, timeout=300, session_id="combo", **config)  # type: ignore[arg-type]
            second.send("\nAnd once again.\nText:\n")
            turn3 = _read_samples(second, 1)
            drafts += _check_turn(turn3, 40)
            second.close()
            assert list(second.call) == []
            info = client.model_info()
    finally:
        assert stop_server(running) == 0
    assert turn3[0][2][0].usage.cached_tokens >= history - 1  # continued from the saved history
    assert drafts > 0, "no draft was proposed: speculation was not exercised"
    assert kv_leaks(info) == []
    assert "session_save_failed" not in (tmp_path / "server.log").read_text()


def test_kvu_window_cells_taken_by_another_slot_and_a_named_session_reopened(tmp_path: Path) -> None:
    running = start_server(["-np", "2", "-c", "4096", "-t", "2", "-kvu", "--session-dir", str(tmp_path / "sessions")],
                           tmp_path / "server.log")
    long_text = "Here is a list. " + " ".join(f"item{i} is {i * 7 % 13}." for i in range(200))  # > n_swa tokens
    question = "\nQuestion: what is item3?\nAnswer:"
    greedy = dict(max_tokens=12, temperature=0, ignore_eos=True, top_logprobs=4)
    try:
        with grpc.insecure_channel(running.address) as channel, Client(running.address, timeout=300) as client:
            assert len(client.tokenize(long_text)) > client.model_info().n_swa
            first = SessionStream(channel, timeout=300, session_id="long", **greedy)  # type: ignore[arg-type]
            first.send(long_text)
            _, reply1, end1 = first.read_turn()
            first.close()
            assert list(first.call) == []
            # The other slot's tokens land in the cells that left the long sequence's window.
            client.generate("Tell me about cats " * 3, max_tokens=1, temperature=0)
            client.generate("Quantum physics summary please " * 3, max_tokens=30, temperature=0, ignore_eos=True)
            history = end1.usage.prompt_tokens + end1.usage.completion_tokens
            second = SessionStream(channel, timeout=300, session_id="long", **greedy)  # type: ignore[arg-type]
            second.send(question)
            continued, end2 = _read_turn(second)
            second.close()
            assert list(second.call) == []
            # The same conversation as one prompt on a fresh stream: the same reply, up to rounding.
            whole = [*client.tokenize(long_text), *reply1, *client.tokenize(question, add_special=False)]
            cold = client.generate(whole, **greedy)
            info = client.model_info()
    finally:
        assert stop_server(running) == 0
    assert end2.usage.cached_tokens >= history - 1  # from the saved state, window and all
    parting(cold.logprobs, continued)
    assert kv_leaks(info) == []
    log = (tmp_path / "server.log").read_text()
    assert "session_save_failed" not in log and "session_state_rejected" not in log


def _read_turn(stream: SessionStream) -> tuple[list[pb.TokenLogprob], pb.TurnEnd]:
    logprobs: list[pb.TokenLogprob] = []
    while True:
        response = stream.next_response()
        if response.HasField("chunk"):
            logprobs.extend(response.chunk.logprobs)
        elif response.HasField("turn_end"):
            return logprobs, response.turn_end


def test_a_context_shift_in_the_middle_of_speculation(tmp_path: Path) -> None:
    running = start_server(["-np", "2", "-c", "512", "-t", "2", "--context-shift", "--keep", "4",
                            "--spec-type", "ngram-simple"], tmp_path / "server.log", metrics=True)
    try:
        with Client(running.address, timeout=300) as client:
            per_slot = client.model_info().n_ctx_per_slot
            prompt = "Repeat after me forever: the cat sat on the mat. the cat sat on the mat. the cat sat on the mat."
            result = client.generate(prompt, max_tokens=3 * per_slot, temperature=0, ignore_eos=True)
            info = client.model_info()
        shifts = metric(running.metrics_port, "llmserve_context_shifts_total")
    finally:
        assert stop_server(running) == 0
    end = result.turn_end
    assert end.finish_reason == pb.FINISH_REASON_LENGTH
    assert end.usage.completion_tokens == 3 * per_slot == len(result.token_ids)
    assert end.usage.draft_tokens > 0 and end.usage.accepted_draft_tokens > 0
    assert shifts >= 2
    assert all(s.num_cached_tokens <= per_slot for s in info.slots)
    assert kv_leaks(info) == []
