"""The client commands and the SDK against a server with mTLS and an API key: the TLS
flags and their LLMSERVE_* variables, `health` as a container's HEALTHCHECK runs it,
a list of host names over TLS, and the OpenAI HTTP port under the same TLS."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from llmserve.client import Client

from harness.server import RunningServer, free_port, start_server, stop_server
from tests import certs

API_KEY = "cli-s3cret"


@dataclass(frozen=True)
class Files:
    server_cert: Path
    ca: Path  # the server certificate's CA
    client_cert: Path
    client_key: Path


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Files:
    directory = tmp_path_factory.mktemp("cli-tls")
    ca, ca_key, ca_cert = certs.make_ca("llmserve CLI test CA")
    server_cert, _ = certs.write(certs.make_leaf("localhost", ca_key, ca_cert), directory, "server")
    client_cert, client_key = certs.write(certs.make_leaf("client", ca_key, ca_cert), directory, "client")
    (directory / "ca.crt").write_bytes(ca.cert)
    return Files(server_cert, directory / "ca.crt", client_cert, client_key)


def _secure(address: str, files: Files) -> grpc.Channel:
    creds = grpc.ssl_channel_credentials(
        files.ca.read_bytes(), files.client_key.read_bytes(), files.client_cert.read_bytes()
    )
    return grpc.secure_channel(address, creds)


@pytest.fixture(scope="module")
def mtls_server(files: Files) -> Iterator[RunningServer]:
    """mTLS (clients need a certificate from the same CA) and an API key, with Embed."""
    running = start_server(
        ["-np", "2", "-c", "2048", "-t", "2", "--embeddings", "--tls-cert", str(files.server_cert),
         "--tls-key", str(files.server_cert.with_suffix(".key")), "--tls-client-ca", str(files.ca),
         "--api-key", API_KEY],
        files.ca.parent / "server.log",
        channel_factory=functools.partial(_secure, files=files),
        http_port=free_port(),
    )
    yield running
    assert stop_server(running) == 0


def _llmserve(*args: str, stdin: str = "", **variables: str) -> subprocess.CompletedProcess[str]:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("LLMSERVE_")}, **variables}
    return subprocess.run([sys.executable, "-m", "llmserve.service", *args], input=stdin, capture_output=True,
                          text=True, timeout=120, env=env)


def _flags(server: RunningServer, files: Files) -> list[str]:
    return ["--address", server.address, "--tls-ca", str(files.ca), "--tls-client-cert", str(files.client_cert),
            "--tls-client-key", str(files.client_key)]


def test_every_client_command_takes_the_tls_flags_and_the_key_from_the_environment(
    mtls_server: RunningServer, files: Files
) -> None:
    flags = _flags(mtls_server, files)
    commands = {
        "generate": ["generate", *flags, "-n", "2", "Hello"],
        "chat": ["chat", *flags, "-n", "2"],
        "embed": ["embed", *flags],
        "tokenize": ["tokenize", *flags, "Hello"],
        "info": ["info", *flags],
        "health": ["health", *flags],
    }
    for name, args in commands.items():
        out = _llmserve(*args, stdin="Hello\n", LLMSERVE_API_KEY=API_KEY)
        assert out.returncode == 0, (name, out.stderr)
    assert json.loads(_llmserve(*commands["info"], LLMSERVE_API_KEY=API_KEY).stdout)["architecture"] == "gemma3"
    refused = _llmserve(*commands["info"], LLMSERVE_API_KEY="wrong")
    assert refused.returncode == 1 and "UNAUTHENTICATED" in refused.stderr
    without_client_cert = _llmserve("info", "--address", mtls_server.address, "--tls-ca", str(files.ca),
                                    LLMSERVE_API_KEY=API_KEY)
    assert without_client_cert.returncode == 1 and "UNAVAILABLE" in without_client_cert.stderr
    plaintext = _llmserve("health", "--address", mtls_server.address)
    assert plaintext.returncode == 1 and "UNAVAILABLE" in plaintext.stdout


def test_the_server_name_the_certificate_must_carry(mtls_server: RunningServer, files: Files) -> None:
    flags = _flags(mtls_server, files)
    assert _llmserve("health", *flags, "--tls-server-name", "localhost").returncode == 0
    wrong = _llmserve("health", *flags, "--tls-server-name", "elsewhere.example")
    assert wrong.returncode == 1 and "UNAVAILABLE" in wrong.stdout


def test_health_as_a_container_healthcheck_runs_it(mtls_server: RunningServer, files: Files) -> None:
    """`llmserve health` with no flags, in the server's environment (the Dockerfile's HEALTHCHECK):
    the port from LLMSERVE_PORT, TLS because LLMSERVE_TLS_CERT is set, the trust and the
    client certificate from their variables."""
    port = mtls_server.address.rsplit(":", 1)[1]
    container = dict(
        LLMSERVE_HOST="0.0.0.0", LLMSERVE_PORT=port, LLMSERVE_TLS_CERT=str(files.server_cert),
        LLMSERVE_TLS_KEY=str(files.server_cert.with_suffix(".key")), LLMSERVE_TLS_CLIENT_CA=str(files.ca),
        LLMSERVE_API_KEY=API_KEY, LLMSERVE_TLS_CA=str(files.ca),
        LLMSERVE_TLS_CLIENT_CERT=str(files.client_cert), LLMSERVE_TLS_CLIENT_KEY=str(files.client_key),
    )
    out = _llmserve("health", **container)
    assert out.returncode == 0 and out.stdout.strip() == f"127.0.0.1:{port}: SERVING", out
    # A server certificate the default roots trust (GRPC_DEFAULT_SSL_ROOTS_FILE_PATH stands in
    # for the system's): no LLMSERVE_TLS_CA needed.
    roots = {k: v for k, v in container.items() if k != "LLMSERVE_TLS_CA"}
    assert _llmserve("health", **roots, GRPC_DEFAULT_SSL_ROOTS_FILE_PATH=str(files.ca)).returncode == 0
    assert _llmserve("health", **roots).returncode == 1  # the system's roots do not know the test CA


def test_sdk_list_of_host_names_over_mtls(mtls_server: RunningServer, files: Files) -> None:
    port = mtls_server.address.rsplit(":", 1)[1]
    options = dict(root_certificates=files.ca, client_cert=files.client_cert, client_key=files.client_key,
                   api_key=API_KEY, timeout=30)
    with Client([f"localhost:{port}", f"127.0.0.1:{port}"], **options) as client:
        assert client.model_info().architecture == "gemma3"
        assert client.generate("Hello", max_tokens=2).turn_end.usage.completion_tokens == 2


def test_the_http_port_has_the_same_tls_and_key(mtls_server: RunningServer, files: Files) -> None:
    """The OpenAI SDK over HTTPS with the client certificate and the key; without the client
    certificate, or over plain HTTP, there is no answer."""
    import ssl

    import openai

    base = f"https://localhost:{mtls_server.http_port}/v1"
    trust = ssl.create_default_context(cafile=str(files.ca))
    with_cert = ssl.create_default_context(cafile=str(files.ca))
    with_cert.load_cert_chain(str(files.client_cert), str(files.client_key))
    with openai.DefaultHttpxClient(verify=with_cert) as http:
        client = openai.OpenAI(base_url=base, api_key=API_KEY, http_client=http, max_retries=0, timeout=60)
        model = client.models.list().data[0].id
        reply = client.completions.create(model=model, prompt="Hello", max_tokens=2)
        assert reply.usage is not None and reply.usage.completion_tokens == 2
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=base, api_key="wrong", http_client=http, max_retries=0).models.list()
    with openai.DefaultHttpxClient(verify=trust) as no_client_cert, pytest.raises(openai.APIConnectionError):
        openai.OpenAI(base_url=base, api_key=API_KEY, http_client=no_client_cert, max_retries=0).models.list()
    with pytest.raises(openai.APIConnectionError):
        openai.OpenAI(base_url=f"http://localhost:{mtls_server.http_port}/v1", api_key=API_KEY,
                      max_retries=0, timeout=10).models.list()
