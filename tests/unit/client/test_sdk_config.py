"""The SDK's building blocks without a server: session_config reaches every SessionConfig
field, the published service config and keepalive, address lists, error details."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor
from google.rpc import code_pb2, error_details_pb2, status_pb2
from llmserve.client import SERVICE_CONFIG, InvalidArgument, ResourceExhausted, pb, session_config
from llmserve.client.connection import ConnectionOptions, channel_target
from llmserve.client.errors import from_rpc_error
from llmserve.client.policy import KEEPALIVE_OPTIONS, default_channel_options

ROOT = Path(__file__).resolve().parents[3]
FD = descriptor.FieldDescriptor
GROUPS = ("sampling", "stopping", "output", "constraint")  # submessages whose fields are keywords


def _leaves(message: descriptor.Descriptor, prefix: str = "") -> list[tuple[str, descriptor.FieldDescriptor]]:
    """Every settable field of SessionConfig, as (dotted path, field)."""
    found = []
    for field in message.fields:
        if field.name in GROUPS and not prefix:
            found += _leaves(field.message_type, f"{field.name}.")
        else:
            found.append((prefix + field.name, field))
    return found


def _sample(field: descriptor.FieldDescriptor) -> Any:
    """A value, unlike the default, that the keyword of this field takes."""
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        return {7: -1.5}
    if field.message_type is not None and field.message_type.name == "Tool":
        return [pb.Tool(name="f", parameters="{}")]
    if field.message_type is not None and field.message_type.name == "ToolChoice":
        return pb.ToolChoice(mode=pb.ToolChoice.MODE_REQUIRED)
    if field.message_type is not None and field.message_type.name == "AdapterRef":
        return pb.AdapterRef(name="tuned", scale=0.5)
    if field.message_type is not None:  # StringList
        return ["a", "b"]
    scalar = {FD.TYPE_BOOL: True, FD.TYPE_STRING: "x", FD.TYPE_FLOAT: 0.5, FD.TYPE_DOUBLE: 0.5}.get(field.type, 3)
    return [scalar, scalar] if field.is_repeated else scalar


def _get(config: pb.SessionConfig, path: str) -> Any:
    value: Any = config
    for part in path.split("."):
        value = getattr(value, part)
    return value


def test_every_session_config_field_is_a_keyword_of_session_config() -> None:
    leaves = _leaves(pb.SessionConfig.DESCRIPTOR)
    assert len(leaves) > 30
    missing = []
    for path, field in leaves:
        value = _sample(field)
        try:
            config = session_config(**{field.name: value})
        except TypeError:
            missing.append(path)
            continue
        got = _get(config, path)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            got = dict(got)
        elif field.message_type is not None and field.message_type.name == "StringList":
            got = list(got.values)
        elif field.is_repeated:
            got = list(got)
        assert got == pytest.approx(value) if isinstance(value, float) else got == value, path
        parent = config if "." not in path else _get(config, path.rsplit(".", 1)[0])
        if field.has_presence:
            assert parent.HasField(field.name), path
    assert not missing, f"SessionConfig fields session_config() cannot set: {missing}"


def test_session_config_conveniences_and_mistakes() -> None:
    assert session_config(logprobs=True).output.HasField("top_logprobs")  # logprobs alone: top 0
    assert session_config(logprobs=True, top_logprobs=5).output.top_logprobs == 5
    assert not session_config().output.HasField("top_logprobs")
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert json.loads(session_config(json_schema=schema).constraint.json_schema) == schema
    assert not session_config(temperature=None).sampling.HasField("temperature")  # None: the server's default
    with pytest.raises(ValueError, match="give one of"):
        session_config(grammar="root ::= \"a\"", json_schema="{}")
    with pytest.raises(ValueError, match="give one of"):
        session_config(regex="[a-z]+", choice=["a", "b"])
    assert list(session_config(choice=["a", "b"]).constraint.choice.values) == ["a", "b"]
    assert session_config(json_object=True).constraint.WhichOneof("kind") == "json_object"
    with pytest.raises(TypeError, match="temprature"):
        session_config(temprature=0.5)
    tools = session_config(tools=[{"name": "f", "description": "d", "parameters": {"type": "object"}}],
                           tool_choice="f", parallel_tool_calls=True)
    assert json.loads(tools.tools[0].parameters) == {"type": "object"} and tools.tools[0].description == "d"
    assert (tools.tool_choice.mode, tools.tool_choice.function_name) == (pb.ToolChoice.MODE_FUNCTION, "f")
    assert session_config(tool_choice="auto").tool_choice.mode == pb.ToolChoice.MODE_AUTO


def test_published_service_config_retries_and_waits_for_ready() -> None:
    (method,) = SERVICE_CONFIG["methodConfig"]
    assert method["name"] == [{"service": pb.DESCRIPTOR.services_by_name["LLMService"].full_name}]
    assert method["waitForReady"] is True
    policy = method["retryPolicy"]
    assert set(policy["retryableStatusCodes"]) == {"UNAVAILABLE", "RESOURCE_EXHAUSTED"}
    assert 2 <= policy["maxAttempts"] <= 5  # gRPC caps attempts at 5
    options = dict(default_channel_options())
    assert json.loads(options["grpc.service_config"]) == SERVICE_CONFIG and options["grpc.enable_retries"] == 1
    assert dict(default_channel_options(retries=False))["grpc.enable_retries"] == 0


def test_client_keepalive_stays_within_the_servers_ping_enforcement() -> None:
    from llmserve.service.config import ServerConfig

    keepalive, server = dict(KEEPALIVE_OPTIONS), ServerConfig()
    assert keepalive["grpc.keepalive_time_ms"] >= 2 * server.keepalive_min_time_s * 1000  # with margin
    assert keepalive["grpc.keepalive_permit_without_calls"] <= int(server.keepalive_permit_without_calls)
    assert keepalive["grpc.keepalive_timeout_ms"] < keepalive["grpc.keepalive_time_ms"]


def test_address_lists_resolve_names_and_keep_literals() -> None:
    plain = ConnectionOptions()
    target, args = channel_target(["localhost:1234", "127.0.0.1:5678"], plain)
    assert target == "ipv4:127.0.0.1:1234,127.0.0.1:5678"
    assert dict(args)["grpc.lb_policy_name"] == "round_robin" and dict(args)["grpc.default_authority"] == "localhost:1234"
    assert channel_target(["[::1]:1", "[::1]:2"], plain)[0] == "ipv6:[::1]:1,[::1]:2"
    assert channel_target(["127.0.0.1:1", "127.0.0.1:1"], plain)[0] == "ipv4:127.0.0.1:1"  # duplicates dropped
    assert channel_target(["localhost:9"], plain)[0] == "localhost:9"  # one address: gRPC resolves it
    secure = dict(channel_target(["localhost:1", "127.0.0.1:2"], ConnectionOptions(tls=True))[1])
    assert secure["grpc.ssl_target_name_override"] == "localhost"  # TLS checks the first entry's name
    with pytest.raises(ValueError, match="cannot resolve"):
        channel_target(["no-such-host.invalid:1", "localhost:2"], plain)
    with pytest.raises(ValueError, match="host:port"):
        channel_target(["localhost", "localhost:2"], plain)
    custom = dict(channel_target("h:1", ConnectionOptions(options=[("grpc.keepalive_time_ms", 600_000)]))[1])
    assert custom["grpc.keepalive_time_ms"] == 600_000  # the caller's options win


class _FakeError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, message: str, status: status_pb2.Status | None) -> None:
        self._code, self._message = code, message
        self._metadata = (("grpc-status-details-bin", status.SerializeToString()),) if status else ()

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._message

    def trailing_metadata(self) -> tuple[tuple[str, bytes], ...]:
        return self._metadata


def test_error_details_are_read_with_rpc_status() -> None:
    bad = error_details_pb2.BadRequest(field_violations=[
        error_details_pb2.BadRequest.FieldViolation(field="config.n", description="too many"),
        error_details_pb2.BadRequest.FieldViolation(field="input", description="empty"),
    ])
    status = status_pb2.Status(code=code_pb2.INVALID_ARGUMENT, message="bad")
    status.details.add().Pack(bad)
    err = from_rpc_error(_FakeError(grpc.StatusCode.INVALID_ARGUMENT, "bad", status))
    assert isinstance(err, InvalidArgument) and err.status == status
    assert err.field == "config.n" and err.field_violations == (("config.n", "too many"), ("input", "empty"))

    retry = status_pb2.Status(code=code_pb2.RESOURCE_EXHAUSTED, message="full")
    retry.details.add().Pack(error_details_pb2.RetryInfo(retry_delay={"seconds": 1, "nanos": 500_000_000}))
    err = from_rpc_error(_FakeError(grpc.StatusCode.RESOURCE_EXHAUSTED, "full", retry))
    assert isinstance(err, ResourceExhausted) and err.retry_after_s == 1.5 and err.field is None

    # Details that contradict the status line are ignored (rpc_status refuses them).
    err = from_rpc_error(_FakeError(grpc.StatusCode.RESOURCE_EXHAUSTED, "other message", retry))
    assert err.status is None and err.retry_after_s is None
    assert from_rpc_error(_FakeError(grpc.StatusCode.UNAVAILABLE, "down", None)).status is None


def test_generate_calls_carry_the_affinity_header() -> None:
    header = "x-llmserve-affinity"
    assert (header, "s-1") in ConnectionOptions().call_kwargs(None, session_config(session_id="s-1"))["metadata"]
    assert dict(ConnectionOptions().call_kwargs(None)["metadata"]).get(header) is None  # no key: none sent
    chosen = ConnectionOptions(affinity_key="tenant-9", api_key="k").call_kwargs(None, session_config(session_id="s-1"))[
        "metadata"]
    assert dict(chosen)[header] == "tenant-9" and dict(chosen)["authorization"] == "Bearer k"  # the caller's key wins
