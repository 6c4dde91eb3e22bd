"""The status mapping: ServiceErrors keep their code and details; anything else is INTERNAL."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from google.rpc import error_details_pb2
from llmserve.service.metrics import Metrics
from llmserve.service.transport.errors import InvalidArgument, ResourceExhausted, rpc_errors


class _Aborted(Exception):
    pass


class FakeContext:
    def __init__(self) -> None:
        self.status: grpc.Status | None = None

    async def abort_with_status(self, status: grpc.Status) -> None:
        self.status = status
        raise _Aborted

    def time_remaining(self) -> None:
        return None


class Servicer:
    def __init__(self, error: Exception) -> None:
        self.metrics = Metrics()
        self.error = error

    @rpc_errors
    async def Unary(self, request: object, context: FakeContext) -> None:
        raise self.error


def _call(error: Exception) -> tuple[grpc.Status, Servicer]:
    servicer, context = Servicer(error), FakeContext()
    with pytest.raises(_Aborted):
        asyncio.run(servicer.Unary(None, context))
    assert context.status is not None
    return context.status, servicer


def _details(status: grpc.Status) -> list[object]:
    from google.rpc import status_pb2

    proto = status_pb2.Status.FromString(dict(status.trailing_metadata)["grpc-status-details-bin"])
    out: list[object] = []
    for any_ in proto.details:
        for cls in (error_details_pb2.BadRequest, error_details_pb2.RetryInfo):
            msg = cls()
            if any_.Unpack(msg):
                out.append(msg)
    return out


def test_invalid_argument_carries_the_field() -> None:
    status, servicer = _call(InvalidArgument("bad top_p", field="config.sampling.top_p"))
    assert status.code == grpc.StatusCode.INVALID_ARGUMENT
    (bad,) = _details(status)
    assert bad.field_violations[0].field == "config.sampling.top_p"  # type: ignore[attr-defined]
    assert servicer.metrics.requests.labels("Unary", "INVALID_ARGUMENT")._value.get() == 1


def test_resource_exhausted_carries_retry_info() -> None:
    status, _ = _call(ResourceExhausted("busy", retry_after_s=1.5))
    assert status.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    (retry,) = _details(status)
    assert retry.retry_delay.ToMilliseconds() == 1500  # type: ignore[attr-defined]


def test_any_other_exception_is_internal_and_logged(capsys: pytest.CaptureFixture[str]) -> None:
    status, _ = _call(KeyError("oops"))
    assert status.code == grpc.StatusCode.INTERNAL
    assert "KeyError" in status.details
    assert "rpc_internal_error" in capsys.readouterr().out + capsys.readouterr().err
