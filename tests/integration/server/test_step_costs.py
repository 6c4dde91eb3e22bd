"""What a decode step costs is timed on the machine the server runs on (issue 41 §2): the
first start measures the table (model/step_timing.py) and caches it under
$LLMSERVE_CACHE_DIR/step-costs, a later start reads it, `--step-costs builtin` measures
nothing. The real server and model; the table's numbers are this machine's, so only their
shape is checked (positive, more rows never cheaper than one)."""

from __future__ import annotations

import json
from pathlib import Path

from llmserve.client import Client
from llmserve.service.model.default_model import default_model_path

from harness.server import server_log_lines, serving

FLAGS = ["-np", "2", "-c", "2048", "-t", "2"]


def _step_costs_events(log: Path) -> list[dict[str, object]]:
    return [line for line in server_log_lines(log) if line.get("event") == "step_costs"]


def _serves(address: str) -> None:
    with Client(address) as client:
        reply = client.generate("Count: one, two, three,", max_tokens=8, temperature=0, ignore_eos=True)
    assert reply.turn_end.usage.completion_tokens == 8 and len(reply.token_ids) == 8


def test_the_first_start_measures_the_next_reads_the_cached_table(tmp_path: Path) -> None:
    env = {"LLMSERVE_CACHE_DIR": str(tmp_path / "cache")}
    flags = [*FLAGS, "-m", str(default_model_path())]  # the model from the usual cache, not assembled again
    for source in ("measured", "cached"):
        log = tmp_path / f"{source}.log"
        with serving(flags, log, env=env) as server:
            _serves(server.address)
        (event,) = _step_costs_events(log)
        assert event["source"] == source, event
    (saved,) = (tmp_path / "cache" / "step-costs").glob("*.json")
    table = json.loads(saved.read_text())
    assert table["key"]["threads"] == 2 and table["key"]["model"] == default_model_path().name
    decode = dict(table["decode_ms"])
    assert sorted(decode) == [1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 16, 17, 24, 32]
    assert all(ms > 0 for ms in decode.values()) and min(decode.values()) == decode[1]
    assert sorted(dict(table["prefill_ms"])) == [1, 64, 128]


def test_builtin_measures_nothing(tmp_path: Path) -> None:
    env = {"LLMSERVE_CACHE_DIR": str(tmp_path / "cache")}
    log = tmp_path / "builtin.log"
    with serving([*FLAGS, "-m", str(default_model_path()), "--step-costs", "builtin"], log, env=env) as server:
        _serves(server.address)
    assert _step_costs_events(log) == [] and not (tmp_path / "cache" / "step-costs").exists()
