"""The chaos soak's checks of the server's side (tests/soak/chaos_checks.py), fed what broken
servers leave behind: cancels it never saw, turns that ran on, generation refused."""

from __future__ import annotations

from collections import Counter

from tests.soak.chaos_checks import CancelCounts, CancelledCall, Outcome, cancel_findings, service_findings

MID_TURN = [CancelledCall("cancel_call", "c-0", 2), CancelledCall("disconnect", "c-1", 1)]
EARLY = CancelledCall("cancel_call", "c-2", 0)  # cancelled before its first token: maybe still waiting
ZERO, TWO = CancelCounts(0, 0), CancelCounts(2, 2)


def _ends(*pairs: tuple[str, str]) -> list[dict[str, str]]:
    return [{"event": "turn_end", "request_id": rid, "finish_reason": reason} for rid, reason in pairs]


def test_a_server_that_ended_each_cancelled_turn_passes() -> None:
    log = _ends(("c-0", "CANCELLED"), ("c-1", "CANCELLED"), ("other", "LENGTH"))
    assert cancel_findings([*MID_TURN, EARLY], log, ZERO, TWO) == []
    assert cancel_findings([*MID_TURN, EARLY], [*log, *_ends(("c-2", "CANCELLED"))], ZERO, CancelCounts(3, 3)) == []


def test_a_cancel_the_server_never_saw_fails() -> None:
    found = cancel_findings(MID_TURN, _ends(("c-0", "CANCELLED")), ZERO, TWO)
    assert any("c-1: cancelled after 1 responses, and the server logged no turn end" in x for x in found), found


def test_a_turn_that_ran_on_after_its_cancel_fails() -> None:
    found = cancel_findings([*MID_TURN, EARLY], _ends(("c-0", "LENGTH"), ("c-1", "CANCELLED"), ("c-2", "LENGTH")),
                            ZERO, TWO)
    assert any("c-0: cancelled by its client, its turn ended ['LENGTH']" in x for x in found), found
    assert any("c-2:" in x for x in found), found


def test_metrics_that_miss_the_cancels_fail() -> None:
    log = _ends(("c-0", "CANCELLED"), ("c-1", "CANCELLED"))
    assert any("the metrics counted 1 turns CANCELLED" in x for x in cancel_findings(MID_TURN, log, ZERO, CancelCounts(1, 2)))
    assert any("counted 0 Generate RPCs" in x for x in cancel_findings(MID_TURN, log, TWO, CancelCounts(4, 2)))


def test_a_server_that_refuses_generation_fails() -> None:
    served = Counter({Outcome("turn", "OK"): 60, Outcome("burst", "OK"): 12, Outcome("burst", "RESOURCE_EXHAUSTED"): 8,
                      Outcome("multiturn", "OK"): 20, Outcome("hostile", "INVALID_ARGUMENT"): 30})
    assert service_findings(served, []) == []
    refusing = Counter({Outcome("turn", "RESOURCE_EXHAUSTED"): 60, Outcome("burst", "RESOURCE_EXHAUSTED"): 20,
                        Outcome("multiturn", "RESOURCE_EXHAUSTED"): 20, Outcome("hostile", "INVALID_ARGUMENT"): 30})
    found = service_findings(refusing, ["turn"] * 50)
    assert any("turn: none of 60 calls OK" in x for x in found), found
    assert any("50 of 130 Generate calls were RESOURCE_EXHAUSTED with room" in x for x in found), found
    some = served + Counter({Outcome("turn", "RESOURCE_EXHAUSTED"): 20})  # refused while full: the server's right
    assert service_findings(some, ["turn"]) == []  # one of 150 with room: within 1%
    assert any("2 of 150 Generate calls" in x for x in service_findings(some, ["turn", "multiturn"]))
