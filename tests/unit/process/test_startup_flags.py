"""Flag rules checked before llama.cpp is called (a GGML_ASSERT there kills the process),
and the HTTP connection flags with the rules http/connections.py applies to them."""

from __future__ import annotations

import re
import resource
import subprocess
import sys
from dataclasses import dataclass

import pytest
from llmserve.service import cli
from llmserve.service.config import HttpConnectionSettings
from llmserve.service.http.connections import ConnectionLimits, Phase, _Connection


def _config(*flags: str):  # type: ignore[no-untyped-def]
    return cli.build_config(cli.parse_args(["serve", *flags]))


def test_a_batch_smaller_than_the_slots_is_refused_naming_the_flags() -> None:
    with pytest.raises(ValueError, match=r"--batch-size 1 is smaller than --parallel 4"):
        _config("-b", "1", "-np", "4")
    with pytest.raises(ValueError, match=r"--ubatch-size 2 \(with --embeddings a batch is one ubatch\) is smaller "
                                         r"than --parallel 4"):
        _config("-b", "2048", "-ub", "2", "-np", "4", "--embeddings")
    assert _config("-b", "4", "-ub", "1", "-np", "4").n_batch_effective == 4  # generation's batch only
    assert _config("-b", "1", "-ub", "1", "-np", "1", "-c", "16").n_parallel == 1


def test_http_connection_flags() -> None:
    assert _config().http == HttpConnectionSettings(timeout=60.0, http_keepalive_timeout=30.0, http_max_connections=None)
    config = _config("-to", "5", "--http-keepalive-timeout", "7", "--http-max-connections", "9")
    assert config.http == HttpConnectionSettings(5.0, 7.0, 9)
    for flags, flag in ((("--timeout", "0"), "--timeout"), (("--http-keepalive-timeout", "-1"), "--http-keepalive"),
                        (("--http-max-connections", "0"), "--http-max-connections")):
        with pytest.raises(ValueError, match=flag):
            _config(*flags)


def test_help_documents_the_http_flags_with_defaults_and_variables() -> None:
    out = " ".join(subprocess.run([sys.executable, "-m", "llmserve.service", "serve", "--help"], check=True,
                                  capture_output=True, text=True).stdout.split())
    for flag in ("-to", "--timeout", "--http-keepalive-timeout", "--http-max-connections"):
        assert flag in out and (flag == "-to" or cli._env_name(flag) in out), flag
    assert re.search(r"--timeout TIMEOUT [^-]*LLMSERVE_TIMEOUT\] \(default: 60\.0\)", out)
    assert re.search(r"HTTP_KEEPALIVE_TIMEOUT\] \(default: 30\.0\)", out)


def test_environment_sets_the_http_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMSERVE_TIMEOUT", "12")
    monkeypatch.setenv("LLMSERVE_HTTP_MAX_CONNECTIONS", "33")
    assert _config().http == HttpConnectionSettings(12.0, 30.0, 33)


@pytest.mark.parametrize(("soft", "cap"), [(1024, 512), (20000, 1024), (7, 3), (1, 1), (resource.RLIM_INFINITY, 1024)])
def test_the_connection_cap_defaults_to_half_the_open_file_limit(monkeypatch: pytest.MonkeyPatch, soft: int,
                                                                  cap: int) -> None:
    monkeypatch.setattr(resource, "getrlimit", lambda _which: (soft, resource.RLIM_INFINITY))
    assert ConnectionLimits.of(HttpConnectionSettings()).max_connections == cap
    assert ConnectionLimits.of(HttpConnectionSettings(http_max_connections=5000)).max_connections == 5000


def test_aiohttps_own_keepalive_never_fires_before_ours() -> None:
    limits = ConnectionLimits(read_timeout_s=60, keepalive_timeout_s=30, max_connections=1)
    assert limits.aiohttp_keepalive_s > limits.keepalive_timeout_s + limits.read_timeout_s
    assert 0.05 <= ConnectionLimits(0.01, 0.01, 1).sweep_interval_s and limits.sweep_interval_s <= 1.0


@dataclass
class _Transport:
    queued: int = 0

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return self.queued


LIMITS = ConnectionLimits(read_timeout_s=10, keepalive_timeout_s=5, max_connections=8)


def _connection(now: float = 0.0) -> tuple[_Connection, _Transport]:
    connection = _Connection(None, None, now)  # type: ignore[arg-type]
    transport = _Transport()
    connection.transport = transport  # type: ignore[assignment]
    return connection, transport


def test_an_idle_connection_closes_after_the_keepalive_timeout() -> None:
    connection, _ = _connection()
    assert connection.overstayed(4.9, LIMITS) is None
    assert connection.overstayed(5.1, LIMITS) == "idle"
    connection.end_request(20.0)  # a reply sent: the idle time starts again
    assert connection.overstayed(24.9, LIMITS) is None


def test_headers_begun_have_the_read_timeout_from_their_first_byte() -> None:
    connection, _ = _connection()
    connection.request_began = 3.0
    assert connection.overstayed(12.9, LIMITS) is None  # past the keep-alive timeout: not idle
    assert connection.overstayed(13.1, LIMITS) == "header_timeout"


def test_a_request_in_its_body_or_handler_is_not_the_sweepers() -> None:
    connection, _ = _connection()
    connection.begin_request(1.0)
    assert connection.phase is Phase.BODY and connection.overstayed(1000.0, LIMITS) is None
    connection.phase = Phase.HANDLING  # a stream: as long as it takes
    assert connection.overstayed(1000.0, LIMITS) is None
    connection.end_request(1000.0)
    assert connection.phase is Phase.WAITING and connection.request_began is None


def test_a_reply_left_unread_between_requests_times_out_only_without_progress() -> None:
    connection, transport = _connection()
    transport.queued = 1000
    assert connection.overstayed(1.0, LIMITS) is None
    transport.queued = 500  # the client reads: progress
    assert connection.overstayed(10.0, LIMITS) is None
    assert connection.overstayed(19.9, LIMITS) is None
    assert connection.overstayed(20.1, LIMITS) == "write_timeout"
    transport.queued = 0  # flushed at last: idle from then on
    assert connection.overstayed(21.0, LIMITS) is None
    assert connection.overstayed(26.1, LIMITS) == "idle"
