"""Faults around the server, not in it (issue 26 part 4): a --session-dir that is a file
from the start, one that becomes unusable mid-run, and a save that fails halfway.

None of them is a bug, so none may be INTERNAL: a named session that cannot read its
state or take its lock is FAILED_PRECONDITION naming the directory (PreconditionFailure,
RetryInfo); calls without a session id are served; the log says each fault once; and no
fault harms the previous save: the session goes on from it once the directory works.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from llmserve.client import make_input, pb, session_config
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc

from harness.metrics import metric
from harness.server import RunningServer, start_server, stop_server
from tests.helpers import SessionStream

ARGS = ["-np", "2", "-c", "4096", "-t", "2"]
GREEDY = dict(max_tokens=6, temperature=0, ignore_eos=True)


def _turn(channel: grpc.Channel, session_id: str, ids: list[int]) -> tuple[list[int], pb.TurnEnd, dict[str, str]]:
    """One turn of a named session: (sampled ids, turn end, trailing metadata)."""
    s = SessionStream(channel, session_id=session_id, **GREEDY)
    s.send(ids)
    _, sampled, end = s.read_turn()
    s.close()
    assert list(s.call) == []
    return sampled, end, dict(s.call.trailing_metadata() or ())


def _refused(channel: grpc.Channel, session_id: str, directory: Path) -> None:
    """A named call while the directory fails: FAILED_PRECONDITION that names it, not INTERNAL."""
    s = SessionStream(channel, session_id=session_id, **GREEDY)
    s.send("Hello")
    try:
        s.read_turn()
    except grpc.RpcError as err:
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION, (err.code(), err.details())
        assert str(directory) in (err.details() or "") and "--session-dir" in (err.details() or "")
        details = {d.type_url.rsplit("/", 1)[-1]: d for d in rpc_status.from_call(err).details}
        failure = error_details_pb2.PreconditionFailure()
        details["google.rpc.PreconditionFailure"].Unpack(failure)
        assert failure.violations[0].subject == str(directory)
        retry = error_details_pb2.RetryInfo()
        details["google.rpc.RetryInfo"].Unpack(retry)
        assert retry.retry_delay.seconds >= 1
        return
    raise AssertionError("a named session was served without its directory")


def _served_unnamed(channel: grpc.Channel) -> None:
    request = pb.GenerateRequest(config=session_config(max_tokens=3), input=make_input("Hi"), end_of_turn=True)
    responses = list(pb_grpc.LLMServiceStub(channel).Generate(iter([request]), timeout=60))
    assert any(r.HasField("turn_end") for r in responses)


def _replace_by_file(directory: Path, away: Path) -> None:
    """What an unmounted or misconfigured volume looks like, even to root (chmod is not)."""
    directory.rename(away)
    directory.write_text("not a directory")


def _wait_for(server: RunningServer, sample: str, value: float) -> None:
    deadline = time.monotonic() + 30
    while metric(server.metrics_port, sample) < value:
        assert time.monotonic() < deadline, f"{sample} < {value}"
        time.sleep(0.1)


def test_session_dir_faults_are_named_once_and_never_harm_the_previous_save(tmp_path: Path) -> None:
    directory, away = tmp_path / "sessions", tmp_path / "sessions.away"
    directory.write_text("a file where the directory should be")  # from the start
    server = start_server([*ARGS, "--session-dir", str(directory)], tmp_path / "server.log", metrics=True,
                          env={"LLMSERVE_INJECT_FAULT": "save_halfway:doomed"})
    saved = 'llmserve_session_cache_total{result="saved"}'
    try:
        with grpc.insecure_channel(server.address) as channel:
            stub = pb_grpc.LLMServiceStub(channel)

            def ids(text: str, first: bool = False) -> list[int]:
                return list(stub.Tokenize(pb.TokenizeRequest(text=text, add_special=first), timeout=30).ids)

            # 1. A file from the start: the server serves, named sessions are refused by name.
            for _ in range(2):
                _refused(channel, "kept", directory)
            _served_unnamed(channel)
            assert metric(server.metrics_port, "llmserve_session_dir_ok") == 0

            # 2. Fixed: the next named call works.
            directory.unlink()
            directory.mkdir()
            kept1 = ids("Question: Which planet is red?\nAnswer:", first=True)
            kept_g1, _, _ = _turn(channel, "kept", kept1)
            doomed1 = ids("Question: Which planet has rings?\nAnswer:", first=True)
            doomed_g1, _, _ = _turn(channel, "doomed", doomed1)
            _wait_for(server, saved, 2)
            assert metric(server.metrics_port, "llmserve_session_dir_ok") == 1

            # 3. Mid-run the directory becomes a file: refused by name again, unnamed calls served.
            _replace_by_file(directory, away)
            for _ in range(2):
                _refused(channel, "kept", directory)
            _served_unnamed(channel)
            directory.unlink()
            away.rename(directory)
            kept2 = ids("\nQuestion: And which is largest?\nAnswer:")
            _, end, _ = _turn(channel, "kept", kept2)
            assert end.usage.cached_tokens == len(kept1) + len(kept_g1) - 1  # the previous save, whole
            _wait_for(server, saved, 3)

            # 4. A save that fails halfway (ENOSPC injected): the turn was served, the file before it stays.
            doomed2 = ids("\nQuestion: And which is smallest?\nAnswer:")
            _turn(channel, "doomed", doomed2)
            _wait_for(server, 'llmserve_session_cache_total{result="save_failed"}', 1)
            doomed3 = ids("\nQuestion: Which is closest to the sun?\nAnswer:")
            _, end, trailers = _turn(channel, "doomed", doomed3)
            assert end.usage.cached_tokens == len(doomed1) + len(doomed_g1) - 1  # turn 1's save, not turn 2's
            assert "injected halfway" in trailers.get("llmserve-session-store-fault", "")
            # Turn 3's own save (failing halfway too) runs after its reply: wait for it to end.
            _wait_for(server, 'llmserve_session_cache_total{result="save_failed"}', 2)
            assert not [p.name for p in directory.iterdir() if p.name.endswith(".tmp")]
    finally:
        assert stop_server(server) == 0
    log = server.log_path.read_text()
    assert "rpc_internal_error" not in log and "Traceback" not in log
    # Once per fault (the file at start, the file mid-run, the failed save), not once per call.
    assert log.count("session_dir_unusable") == 3, log.count("session_dir_unusable")
    assert log.count("session_dir_recovered") == 2
    shutil.rmtree(directory, ignore_errors=True)
