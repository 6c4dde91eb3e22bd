"""TLS, mutual TLS and the API key, with certificates made in the test."""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from llmserve.client import pb
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc

from harness.metrics import counted
from harness.server import RunningServer, start_server, stop_server
from tests import certs

API_KEY = "s3cret-key"


@dataclass(frozen=True)
class Pki:
    ca: certs.Pem
    client: certs.Pem
    other_ca: certs.Pem
    other_client: certs.Pem


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    ca, ca_key, ca_cert = certs.make_ca("llmserve test CA")
    other_ca, other_key, other_cert = certs.make_ca("some other CA")
    return Pki(
        ca=ca,
        client=certs.make_leaf("client", ca_key, ca_cert),
        other_ca=other_ca,
        other_client=certs.make_leaf("intruder", other_key, other_cert),
    )


def _secure(address: str, trust: bytes, client: certs.Pem | None) -> grpc.Channel:
    creds = grpc.ssl_channel_credentials(
        root_certificates=trust,
        private_key=client.key if client else None,
        certificate_chain=client.cert if client else None,
    )
    return grpc.secure_channel(address, creds)


@pytest.fixture(scope="module")
def tls_server(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    directory = tmp_path_factory.mktemp("tls")
    ca, ca_key, ca_cert = certs.make_ca("server CA")
    server_cert, server_key = certs.write(certs.make_leaf("localhost", ca_key, ca_cert), directory, "server")
    client_ca = directory / "client-ca.crt"
    client_ca.write_bytes(pki.ca.cert)
    (directory / "server-ca.crt").write_bytes(ca.cert)
    factory = functools.partial(_secure, trust=ca.cert, client=pki.client)
    running = start_server(
        ["-np", "1", "-c", "2048", "-t", "2", "--tls-cert", str(server_cert), "--tls-key", str(server_key),
         "--tls-client-ca", str(client_ca)],
        directory / "server.log",
        env={"LLMSERVE_API_KEY": API_KEY},  # the key comes from the environment
        channel_factory=factory,
        metrics=True,
    )
    yield running
    assert stop_server(running) == 0


def _server_ca(server: RunningServer) -> bytes:
    return (server.log_path.parent / "server-ca.crt").read_bytes()


def _info(channel: grpc.Channel, key: str | None) -> pb.ModelInfo:
    metadata = (("authorization", f"Bearer {key}"),) if key is not None else ()
    return pb_grpc.LLMServiceStub(channel).GetModelInfo(pb.GetModelInfoRequest(), metadata=metadata, timeout=10)


def test_mtls_with_the_api_key_works(tls_server: RunningServer, pki: Pki) -> None:
    with _secure(tls_server.address, _server_ca(tls_server), pki.client) as channel:
        assert _info(channel, API_KEY).architecture == "gemma3"
        request = pb.GenerateRequest(
            config=pb.SessionConfig(stopping=pb.StoppingCriteria(max_tokens=2)), input=pb.Input(text="Hi"), end_of_turn=True
        )
        responses = list(
            pb_grpc.LLMServiceStub(channel).Generate(
                iter([request]), metadata=(("authorization", f"Bearer {API_KEY}"),), timeout=30
            )
        )
        assert responses[-1].turn_end.usage.completion_tokens == 2


@pytest.mark.parametrize("key", [None, "wrong-key", ""])
def test_missing_or_wrong_api_key_is_unauthenticated(tls_server: RunningServer, pki: Pki, key: str | None) -> None:
    with _secure(tls_server.address, _server_ca(tls_server), pki.client) as channel:
        with pytest.raises(grpc.RpcError) as err:
            _info(channel, key)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as err:
            list(pb_grpc.LLMServiceStub(channel).Generate(iter([pb.GenerateRequest()]), timeout=10))
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_refused_calls_are_counted(tls_server: RunningServer, pki: Pki) -> None:
    def refused() -> float:
        return counted(tls_server.metrics_port, "grpc_server_handled_total", grpc_code="UNAUTHENTICATED",
                       grpc_method="GetModelInfo", grpc_service="llmserve.v1.LLMService", grpc_type="unary")

    before = refused()
    with _secure(tls_server.address, _server_ca(tls_server), pki.client) as channel:
        for _ in range(3):
            with pytest.raises(grpc.RpcError):
                _info(channel, "wrong-key")
    deadline = time.monotonic() + 5  # the server counts a call as it ends, which can trail the client by a moment
    while refused() < before + 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert refused() == before + 3


def test_health_answers_without_the_api_key(tls_server: RunningServer, pki: Pki) -> None:
    with _secure(tls_server.address, _server_ca(tls_server), pki.client) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize("case", ["client trusts another CA", "client cert from another CA", "no client cert", "plaintext"])
def test_bad_transport_fails(tls_server: RunningServer, pki: Pki, case: str) -> None:
    server_ca = _server_ca(tls_server)
    channel = {
        "client trusts another CA": lambda: _secure(tls_server.address, pki.other_ca.cert, pki.client),
        "client cert from another CA": lambda: _secure(tls_server.address, server_ca, pki.other_client),
        "no client cert": lambda: _secure(tls_server.address, server_ca, None),
        "plaintext": lambda: grpc.insecure_channel(tls_server.address),
    }[case]()
    with channel, pytest.raises(grpc.RpcError) as err:
        _info(channel, API_KEY)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_sdk_tls_and_api_key_options(tls_server: RunningServer, pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> None:
    from llmserve.client import Client, Unauthenticated

    directory = tmp_path_factory.mktemp("sdk")
    ca = directory / "ca.crt"
    ca.write_bytes(_server_ca(tls_server))
    cert, key = certs.write(pki.client, directory, "client")
    options = dict(root_certificates=ca, client_cert=cert, client_key=key, timeout=30)
    with Client(tls_server.address, api_key=API_KEY, **options) as client:
        assert client.health()
        assert client.generate("Hi", max_tokens=2).turn_end.usage.completion_tokens == 2
    with Client(tls_server.address, api_key="wrong", **options) as client, pytest.raises(Unauthenticated):
        client.model_info()
