"""Hostile bodies and headers on every POST route: each a 4xx in OpenAI's error shape naming
what is wrong (never a 500), and the server serves the next request (docs/reliability.md).

Sent with http.client, byte for byte: no SDK would send most of these."""

from __future__ import annotations

import gzip
import http.client
import json
from collections.abc import Iterator

import pytest

from harness.server import CHAT_SERVER_ARGS, RunningServer, free_port, start_server, stop_server

API_KEY = "hostile-key"
ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
SURROGATE = "\ud800"  # legal in JSON as an escape; not Unicode text


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    args = [*CHAT_SERVER_ARGS, "--embeddings", "--api-key", API_KEY]
    running = start_server(args, tmp_path_factory.mktemp("hostile") / "server.log", http_port=free_port())
    yield running
    assert stop_server(running) == 0


def post(server: RunningServer, path: str, body: bytes, headers: dict[str, bytes] | None = None,
         auth: bytes | None = f"Bearer {API_KEY}".encode()) -> tuple[int, dict[str, object], dict[str, str]]:
    """(status, JSON body, headers) of one POST with exactly these bytes."""
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=120)
    try:
        conn.putrequest("POST", path)
        sent = {"Content-Type": b"application/json", "Content-Length": str(len(body)).encode(), **(headers or {})}
        if auth is not None:
            sent["Authorization"] = auth
        for name, value in sent.items():
            conn.putheader(name, value)
        conn.endheaders(body)
        response = conn.getresponse()
        return response.status, json.loads(response.read()), {k.lower(): v for k, v in response.getheaders()}
    finally:
        conn.close()


def refused(status: int, reply: dict[str, object], expected: int = 400) -> dict[str, object]:
    assert status == expected, reply
    error = reply["error"]
    assert isinstance(error, dict) and error["type"] == "invalid_request_error" and error["message"]
    return error


def base_body(path: str) -> dict[str, object]:
    if path.endswith("chat/completions"):
        return {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    if path.endswith("/completions"):
        return {"prompt": "Hi", "max_tokens": 2}
    return {"input": "Hi"}


def assert_serving(server: RunningServer) -> None:
    status, reply, _ = post(server, "/v1/chat/completions", json.dumps(base_body("/v1/chat/completions")).encode())
    assert status == 200 and reply["choices"], reply
    assert server.process.poll() is None


@pytest.mark.parametrize("path", ROUTES)
def test_a_deeply_nested_body_is_a_400(server: RunningServer, path: str) -> None:
    for depth in (300, 100_000):  # past the server's bound, and past the parser's recursion limit
        raw = json.dumps(base_body(path))[:-1].encode() + b', "user": ' + b"[" * depth + b"]" * depth + b"}"
        error = refused(*post(server, path, raw)[:2])
        assert "deeper than" in str(error["message"])
    assert_serving(server)


@pytest.mark.parametrize("path", ROUTES)
def test_a_charset_other_than_utf8_is_a_415(server: RunningServer, path: str) -> None:
    for charset in (b"x-bogus", b"latin-1"):
        headers = {"Content-Type": b"application/json; charset=" + charset}
        error = refused(*post(server, path, json.dumps(base_body(path)).encode(), headers)[:2], expected=415)
        assert error["param"] == "Content-Type"
    status, _, _ = post(server, path, json.dumps(base_body(path)).encode(), {"Content-Type": b"application/json; charset=UTF-8"})
    assert status == 200


@pytest.mark.parametrize("path", ROUTES)
def test_bytes_that_are_not_utf8_are_a_400(server: RunningServer, path: str) -> None:
    raw = json.dumps(base_body(path)).encode().replace(b"Hi", b"H\xff\xfe")
    assert "not UTF-8" in str(refused(*post(server, path, raw)[:2])["message"])


LONE_SURROGATES = [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": f"a{SURROGATE}b"}]}, "messages[0].content"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": SURROGATE}]}]},
     "messages[0].content[0].text"),
    ("/v1/chat/completions", {"messages": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                              "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": f"result {SURROGATE}"}]}, "messages[2].content"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "grammar": f'root ::= "{SURROGATE}"'},
     "grammar"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "stop": ["x", "\udfff"]}, "stop[1]"),
    ("/v1/completions", {"prompt": f"Hello {SURROGATE}"}, "prompt"),
    ("/v1/completions", {"prompt": ["fine", f"{SURROGATE}"]}, "prompt[1]"),
    ("/v1/embeddings", {"input": SURROGATE}, "input"),
    ("/v1/embeddings", {"input": ["ok", f"x{SURROGATE}"]}, "input[1]"),
]


@pytest.mark.parametrize(("path", "body", "param"), LONE_SURROGATES)
def test_a_lone_surrogate_is_refused_naming_its_field(server: RunningServer, path: str, body: dict[str, object],
                                                      param: str) -> None:
    error = refused(*post(server, path, json.dumps(body).encode())[:2])  # json.dumps escapes it: \ud800
    assert error["param"] == param and "lone surrogate" in str(error["message"])


def test_a_surrogate_pair_is_text(server: RunningServer) -> None:
    body = {"messages": [{"role": "user", "content": "\ud83d\ude00"}], "max_tokens": 2}  # one emoji, escaped as a pair
    status, reply, _ = post(server, "/v1/chat/completions", json.dumps(body, ensure_ascii=True).encode())
    assert status == 200, reply


@pytest.mark.parametrize("auth", [b"Bearer \xff\xfe", f"Bearer {API_KEY}".encode() + b"\xff", b"\x80"])
def test_an_authorization_header_that_is_not_utf8_is_a_401(server: RunningServer, auth: bytes) -> None:
    status, reply, _ = post(server, "/v1/chat/completions", json.dumps(base_body("/v1/chat/completions")).encode(),
                            auth=auth)
    assert status == 401 and reply["error"]["code"] == "invalid_api_key", reply  # type: ignore[index]


def test_a_request_id_that_is_not_printable_ascii_is_a_400_and_never_echoed(server: RunningServer) -> None:
    for rid in (b"id-\xff", "id-\u00e9".encode(), b"x" * 129):
        status, reply, headers = post(server, "/v1/chat/completions",
                                      json.dumps(base_body("/v1/chat/completions")).encode(), {"x-request-id": rid})
        assert refused(status, reply)["param"] == "x-request-id"
        assert headers["x-request-id"].isascii() and headers["x-request-id"].encode() != rid
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    conn.request("POST", "/v1/chat/completions", b"{}", {"x-request-id": "id\x01"})
    assert conn.getresponse().status == 400  # a control character: aiohttp's parser refuses the header itself
    conn.close()
    assert_serving(server)


def test_a_completions_prompt_too_long_names_prompt(server: RunningServer) -> None:
    long_prompt = "word " * 5000  # more tokens than a slot's 2,048
    for prompt, param in ((long_prompt, "prompt"), (["Hi", long_prompt], "prompt[1]")):
        reply = post(server, "/v1/completions", json.dumps({"prompt": prompt, "max_tokens": 1}).encode())
        assert refused(*reply[:2])["param"] == param
    assert_serving(server)


@pytest.mark.parametrize("path", ROUTES)
def test_a_body_whose_content_encoding_does_not_decode_is_a_400(server: RunningServer, path: str) -> None:
    raw = b"\x1f\x8b" + b"not gzip at all"
    error = refused(*post(server, path, raw, {"Content-Encoding": b"gzip"})[:2])
    assert error["param"] == "Content-Encoding"
    bomb = gzip.compress(b'{"input": "' + b"a" * (64 << 20) + b'"}')  # 64 MiB inflated: past --max-message-bytes
    assert post(server, path, bomb, {"Content-Encoding": b"gzip"})[0] == 413
    assert_serving(server)
