"""The combination fuzzer's oracle (tests/soak/oracle.py, oracle_run.py) catches broken servers.

Recorded outcomes are built here as a correct server would send them; each test then
breaks one thing the way a faulty server would (a turn dropped, a stop string leaked,
every call refused, a sample missing, ...) and asserts the oracle reports it. The
correct outcomes must pass, so the oracle neither misses faults nor cries wolf.
"""

from __future__ import annotations

import http.server
import json
import threading

import pytest
from llmserve.client import pb

from harness.metrics import counted, metric, total
from tests.soak.oracle import CallRecord, RunContext, Status, check_call
from tests.soak.oracle_run import check_run, log_problems, preempted_requests
from tests.soak.plans import Plan, draw_plans

EOG = 106
PIECES = {10: "Hello", 11: " world", 12: ".", 13: " yes", 14: "yes", 15: "no", 16: '{"a"', 17: ": 1}", EOG: ""}
CTX = RunContext(eog_ids=frozenset({1, EOG}), n_ctx_per_slot=1024, fills_queue=False)
FR = pb.FinishReason
SERVED = Status("OK")


def plan(index: int = 0, *, turns: int = 2, n: int = 1, ending: str = "close", stop: tuple[str, ...] = (),
         max_tokens: int = 8, session_id: str = "", schema: str = "", top_logprobs: int | None = None) -> Plan:
    config = pb.SessionConfig(stopping=pb.StoppingCriteria(max_tokens=max_tokens, stop=list(stop)), session_id=session_id)
    if n > 1:
        config.n = n
    if schema:
        config.constraint.json_schema = schema
    if top_logprobs is not None:
        config.output.top_logprobs = top_logprobs
    return Plan(index, config, chat=False, prompts=["Hi"] * turns, ending=ending)


def turn(ids: list[int], reason: int, *, index: int = 0, cached: int = 0, prompt: int = 3, stop: str = "",
         top: int | None = None, texts: list[str] | None = None) -> list[pb.GenerateResponse]:
    """One sample's turn as the server streams it: a chunk per token (its piece, or `texts`),
    then the turn end."""
    out = []
    for j, t in enumerate(ids):
        chunk = pb.TokenChunk(text=PIECES[t] if texts is None else texts[j], token_ids=[t], index=index)
        if top is not None:
            chunk.logprobs.append(pb.TokenLogprob(token_id=t, logprob=-0.5, top=[pb.TopLogprob()] * top))
        out.append(pb.GenerateResponse(request_id="r1", chunk=chunk))
    usage = pb.Usage(prompt_tokens=prompt, cached_tokens=cached, completion_tokens=len(ids))
    end = pb.TurnEnd(finish_reason=reason, matched_stop=stop, usage=usage, index=index)
    return out + [pb.GenerateResponse(request_id="r1", turn_end=end)]


def record(p: Plan, responses: list[pb.GenerateResponse], status: Status = SERVED, **kw) -> CallRecord:  # type: ignore[no-untyped-def]
    rec = CallRecord(p, responses, status, **kw)
    ends = [0] * p.num_samples  # what Detokenize says of each sample's ids
    ids: dict[tuple[int, int], list[int]] = {}
    for r in responses:
        if r.HasField("chunk"):
            ids.setdefault((ends[r.chunk.index], r.chunk.index), []).extend(r.chunk.token_ids)
        elif r.HasField("turn_end"):
            ends[r.turn_end.index] += 1
    rec.decoded = {k: ("".join(PIECES[t] for t in v), "".join(PIECES[t] for t in v[:-1])) for k, v in ids.items()}
    return rec


def two_turns() -> CallRecord:
    return record(plan(), turn([10, 11, EOG], FR.FINISH_REASON_STOP) + turn([10, 12, EOG], FR.FINISH_REASON_STOP, cached=5))


def test_correct_outcomes_pass() -> None:
    assert check_call(two_turns(), CTX) == []
    samples = plan(n=2, turns=1, stop=("yes",))  # sample 1 stops at " yes": the text before it streams
    both = turn([10, EOG], FR.FINISH_REASON_STOP) + turn(
        [11, 13], FR.FINISH_REASON_STOP_SEQUENCE, index=1, stop="yes", texts=[" world", " "])
    assert check_call(record(samples, both), CTX) == []
    assert check_call(CallRecord(plan(ending="cancel_call"), [], Status("CANCELLED"), acted=True), CTX) == []


def test_a_dropped_turn_is_caught() -> None:
    rec = two_turns()
    rec.responses = rec.responses[:4]  # the second turn never came, yet the call ended OK
    assert any("no turn end for (turn, sample) [(1, 0)]" in p for p in check_call(rec, CTX))


def test_a_leaked_stop_string_is_caught() -> None:
    p = plan(turns=1, stop=("yes",))
    problems = check_call(record(p, turn([10, 13, EOG], FR.FINISH_REASON_STOP)), CTX)
    assert any("the stop string 'yes'" in x for x in problems)


def test_a_stop_sequence_must_name_a_planned_stop_that_follows_the_text() -> None:
    p = plan(turns=1, stop=("yes",))
    problems = check_call(record(p, turn([10, 12], FR.FINISH_REASON_STOP_SEQUENCE, stop="no")), CTX)
    assert any("STOP_SEQUENCE names 'no'" in x for x in problems)


def test_refusing_every_call_is_caught() -> None:
    plans = draw_plans(40, seed=3)
    refused = Status("RESOURCE_EXHAUSTED", "8 sessions are open", retry_after_s=0.5)
    records = [CallRecord(p, [], refused) for p in plans]
    not_sized = check_run(records, CTX)  # a run below the queue's size may not be refused at all
    assert sum("not sized to fill the queue" in f.text for f in not_sized.findings) == len(plans)
    sized = check_run(records, RunContext(CTX.eog_ids, 1024, fills_queue=True))
    assert [f.text for f in sized.findings if f.index is None] == [
        f"{sized.num_valid} of {sized.num_valid} valid calls were RESOURCE_EXHAUSTED (at most 5%)"]
    served = [two_turns() for _ in range(40)]  # one refusal in 41 valid calls is within the bound
    assert check_run([CallRecord(plan(), [], refused), *served], RunContext(CTX.eog_ids, 1024, True)).findings == []


def test_an_omitted_sample_is_caught() -> None:
    p = plan(n=3, turns=1)
    responses = turn([10, EOG], FR.FINISH_REASON_STOP) + turn([11, EOG], FR.FINISH_REASON_STOP, index=2)
    assert any("(0, 1)" in x for x in check_call(record(p, responses), CTX))


def test_limits_logprobs_and_text_are_checked() -> None:
    too_long = check_call(record(plan(turns=1, max_tokens=2), turn([10, 11, 12], FR.FINISH_REASON_LENGTH)), CTX)
    assert any("3 tokens, max_tokens 2" in x for x in too_long)
    wrong_top = check_call(record(plan(turns=1, top_logprobs=3), turn([10, EOG], FR.FINISH_REASON_STOP, top=2)), CTX)
    assert any("alternatives, top_logprobs 3" in x for x in wrong_top)
    rec = record(plan(turns=1), turn([10, 11, EOG], FR.FINISH_REASON_STOP))
    rec.decoded[(0, 0)] = ("Hello there", "Hello there")  # the ids say something else than the text
    assert any("its ids decode to" in x for x in check_call(rec, CTX))
    length = check_call(record(plan(turns=1, max_tokens=5), turn([10, 11], FR.FINISH_REASON_LENGTH)), CTX)
    assert any("finish FINISH_REASON_LENGTH" in x for x in length)


def test_a_schema_output_that_does_not_validate_is_caught() -> None:
    schema = json.dumps({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]})
    problems = check_call(record(plan(turns=1, schema=schema), turn([16, 17, EOG], FR.FINISH_REASON_STOP)), CTX)
    assert any("not valid for the schema" in x for x in problems)


def test_cached_tokens_must_grow_over_the_turns() -> None:
    rec = record(plan(), turn([10, 11, EOG], FR.FINISH_REASON_STOP) + turn([10, 12, EOG], FR.FINISH_REASON_STOP, cached=0))
    assert any("turn 1: cached_tokens 0" in x for x in check_call(rec, CTX))


def test_a_fully_cached_turn_with_a_one_token_reply_need_not_grow_the_cache() -> None:
    # Plan 567 of the spec run: turn 0's prompt was all cached and its one sampled token
    # never went into the KV, so turn 1 reuses the same 3 tokens.
    one = plan(max_tokens=1)
    rec = record(one, turn([13], FR.FINISH_REASON_LENGTH, cached=3) + turn([14], FR.FINISH_REASON_LENGTH, cached=3))
    assert check_call(rec, CTX) == []
    rec = record(one, turn([13], FR.FINISH_REASON_LENGTH, cached=3) + turn([14], FR.FINISH_REASON_LENGTH, cached=2))
    assert any("turn 1: cached_tokens 2" in x for x in check_call(rec, CTX))


def test_a_preempted_stream_may_prefill_its_history_again() -> None:
    rec = record(plan(), turn([10, 11, EOG], FR.FINISH_REASON_STOP) + turn([10, 12, EOG], FR.FINISH_REASON_STOP, cached=0))
    preempted = RunContext(CTX.eog_ids, CTX.n_ctx_per_slot, CTX.fills_queue, preempted=frozenset({"r1"}))
    assert check_call(rec, preempted) == []
    log = json.dumps({"event": "session_preempted", "request_id": "r1", "level": "info"})
    assert preempted_requests(log + "\nnot json") == {"r1"}


def test_a_named_session_refusal_needs_its_reason_and_retry_info() -> None:
    p = plan(session_id="s-text")
    bare = Status("FAILED_PRECONDITION", "session 's-text' is open on another stream", ("config.session_id",))
    assert any("without RetryInfo" in x for x in check_call(CallRecord(p, [], bare), CTX))
    other = Status("FAILED_PRECONDITION", "something else", ("config.session_id",), 1.0)
    assert check_call(CallRecord(p, [], other), CTX) != []
    good = Status("FAILED_PRECONDITION", bare.message, bare.fields, 1.0)
    assert check_call(CallRecord(p, [], good), CTX) == []


def test_a_named_session_that_forgot_its_history_is_caught() -> None:
    first = record(plan(0, session_id="s-text"), turn([10, 11, EOG], FR.FINISH_REASON_STOP)
                   + turn([10, 12, EOG], FR.FINISH_REASON_STOP, cached=5), t_start=0.0, t_end=1.0)
    forgot = record(plan(1, session_id="s-text"), turn([10, EOG], FR.FINISH_REASON_STOP, cached=0)
                    + turn([10, 12, EOG], FR.FINISH_REASON_STOP, cached=4), t_start=2.0, t_end=3.0)
    findings = check_run([first, forgot], CTX).findings
    assert [f.index for f in findings] == [1] and "left at least 12" in findings[0].text
    assert check_run([first, forgot], CTX).failed == {"valid, ends by close": 1}
    kept = record(plan(1, session_id="s-text"), turn([10, EOG], FR.FINISH_REASON_STOP, cached=11)
                  + turn([10, 12, EOG], FR.FINISH_REASON_STOP, cached=15), t_start=2.0, t_end=3.0)
    verdict = check_run([first, kept], CTX)
    assert verdict.findings == [] and verdict.sessions_checked == 1
    # The stream before closed preempted: saved without its KV, so the next one prefills it again.
    closed = RunContext(CTX.eog_ids, CTX.n_ctx_per_slot, CTX.fills_queue, frozenset({"r1"}), frozenset({"r1"}))
    assert check_run([first, forgot], closed).sessions_recomputed == 1
    first.plan.chat = True  # a chat session's next rendering must still hold the conversation
    lost = record(plan(1, session_id="s-text"), turn([10, EOG], FR.FINISH_REASON_STOP, prompt=2)
                  + turn([10, 12, EOG], FR.FINISH_REASON_STOP, cached=4, prompt=9), t_start=2.0, t_end=3.0)
    lost.plan.chat = True
    assert "the first rendering has 2 tokens" in check_run([first, lost], closed).findings[0].text
    log = "\n".join(json.dumps({"event": e, "request_id": r}) for e, r in [
        ("session_preempted", "a"), ("session_resumed", "a"), ("session_preempted", "b")])
    assert (preempted_requests(log), preempted_requests(log, at_close=True)) == ({"a", "b"}, {"b"})


def test_an_adversarial_value_must_be_refused_naming_its_field() -> None:
    p = plan(turns=1)
    p.adversarial = "temperature_nan"
    assert check_call(CallRecord(p, [], Status("INVALID_ARGUMENT", "bad", ("config.sampling.temperature",))), CTX) == []
    assert check_call(CallRecord(p, [], Status("INVALID_ARGUMENT", "bad", ("config.n",))), CTX) != []
    assert check_call(CallRecord(p, [], Status("OK")), CTX) != []


def test_the_log_check_catches_errors_and_failed_saves() -> None:
    ok = json.dumps({"event": "turn_end", "level": "info"})
    save = json.dumps({"event": "session_save_failed", "level": "warning"})
    error = json.dumps({"event": "decode_failed", "level": "error"})
    assert log_problems(ok) == []
    assert len(log_problems("\n".join([ok, save, error, "Traceback (most recent call last):"]))) == 3


def test_an_unknown_metric_name_raises() -> None:
    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = (b"llmserve_sessions 0.0\n# TYPE llmserve_turns_total counter\n"
                    b'llmserve_turns_total{finish_reason="STOP"} 2.0\nllmserve_turns_total{finish_reason="LENGTH"} 3.0\n')
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert metric(server.server_port, "llmserve_sessions") == 0
        with pytest.raises(LookupError):
            metric(server.server_port, "llmserve_sessions_renamed")
        # a labelled sample not counted yet reads 0 (harness/metrics.py), an unknown family raises
        assert counted(server.server_port, "llmserve_turns_total", finish_reason="CANCELLED") == 0
        assert counted(server.server_port, 'llmserve_turns_total{finish_reason="STOP"}') == 2
        assert total(server.server_port, "llmserve_turns_total") == 5
        with pytest.raises(LookupError):
            metric(server.server_port, "llmserve_turns_total", finish_reason="CANCELLED")
        with pytest.raises(LookupError):
            counted(server.server_port, "llmserve_turns_renamed_total", finish_reason="STOP")
    finally:
        server.shutdown()
