"""`llmserve` client commands: generate, chat, embed, tokenize, info, health, bench
(the server's CLI adds them to its parser).

Every command takes the connection flags: --address, --api-key, --tls, --tls-ca,
--tls-client-cert, --tls-client-key, --tls-server-name, each defaulting to its
LLMSERVE_* variable, so that a container's `llmserve health` reaches the server the
same environment configures (the address from LLMSERVE_HOST/LLMSERVE_PORT, TLS on
when LLMSERVE_TLS_CERT is set).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from google.protobuf import json_format

from .command_chat import run_chat
from .command_embed import run_embed
from .envflags import Deferred, EnvError, EnvFlags, from_env, parse_bool
from .errors import LLMServeError
from .sync import Client

DEFAULT_PORT = 50051
_WILDCARDS = {"", "0.0.0.0", "::", "[::]"}


def local_address() -> Deferred:
    """LLMSERVE_ADDRESS, else the server this environment configures: LLMSERVE_HOST
    (127.0.0.1 when it listens on every interface) and LLMSERVE_PORT."""

    def compute() -> str:
        if os.environ.get("LLMSERVE_ADDRESS"):
            return os.environ["LLMSERVE_ADDRESS"]
        host = os.environ.get("LLMSERVE_HOST", "127.0.0.1").strip()
        host = "127.0.0.1" if host in _WILDCARDS else (f"[{host}]" if ":" in host and "[" not in host else host)
        return f"{host}:{from_env('LLMSERVE_PORT', int, DEFAULT_PORT).compute()}"

    return Deferred(compute, os.environ.get("LLMSERVE_ADDRESS") or "127.0.0.1:$LLMSERVE_PORT")


def _tls_default() -> Deferred:
    def compute() -> bool:
        if "LLMSERVE_TLS" in os.environ:
            return bool(from_env("LLMSERVE_TLS", parse_bool, False).compute())
        return bool(os.environ.get("LLMSERVE_TLS_CERT"))

    return Deferred(compute, False)


def _connection_flags(p: argparse.ArgumentParser, timeout: float | None, timeout_help: str) -> None:
    f = EnvFlags(p)
    p.add_argument("--address", default=local_address(),
                   help="host:port, a gRPC target (dns:///name:port), or host:port,host:port,... balanced "
                        "round robin [env LLMSERVE_ADDRESS; else LLMSERVE_HOST and LLMSERVE_PORT]")
    f.add("--api-key", help="sent as authorization: Bearer <key>")
    f.switch("--tls", default=_tls_default(), help="use TLS with the system's roots (default: on when "
             "LLMSERVE_TLS_CERT, the server's certificate, is set)")
    f.add("--tls-ca", type=Path, help="CA certificate (PEM) the server's certificate must chain to; implies --tls")
    f.add("--tls-client-cert", type=Path, help="client certificate (PEM) for mTLS")
    f.add("--tls-client-key", type=Path, help="client private key (PEM) for mTLS")
    f.add("--tls-server-name", help="the name the server's certificate carries, when --address does not name it")
    p.add_argument("--timeout", type=float, default=timeout, help=timeout_help)
    p.add_argument("--wait-for-ready", action="store_true",
                   help="wait for an unreachable server (within --timeout) instead of failing at once")


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    g = sub.add_parser("generate", help="generate text; tokens are printed as they arrive")
    _connection_flags(g, 300.0, "deadline of the call, seconds (default: 300)")
    g.add_argument("prompt", help="the prompt (use - to read it from stdin)")
    g.add_argument("-n", "--max-tokens", type=int, default=128)
    g.add_argument("--temperature", type=float, default=None)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    g.add_argument("--json", action="store_true", help="print one JSON object per response instead of text")
    g.set_defaults(run=_generate)

    e = sub.add_parser("embed", help="embed lines of files (or stdin) into JSONL, as they are read")
    _connection_flags(e, None, "deadline of the whole stream, seconds (default: none)")
    e.add_argument("files", nargs="*", type=Path, help="text files, one input per line (default: stdin)")
    e.add_argument("--no-normalize", action="store_true")
    e.add_argument("--truncate", action="store_true", help="cut inputs longer than one ubatch")
    e.set_defaults(run=run_embed)

    c = sub.add_parser("chat", help="interactive multi-turn chat on one stream (Ctrl-C stops a reply)")
    _connection_flags(c, 300.0, "time limit of each turn, seconds; a turn past it is cancelled (default: 300)")
    c.add_argument("-n", "--max-tokens", type=int, default=256)
    c.add_argument("--temperature", type=float, default=0.7)
    c.add_argument("--system", default=None, help="system message (chat-template servers)")
    c.set_defaults(run=run_chat, per_turn_timeout=True)

    sub.add_parser("bench", help="load test a server (llmserve bench --help for its flags)", add_help=False)

    t = sub.add_parser("tokenize", help="print the token ids (and pieces) of a text")
    _connection_flags(t, 300.0, "deadline of the call, seconds (default: 300)")
    t.add_argument("text")
    t.add_argument("--embedding-model", action="store_true", help="with the vocabulary Embed uses")
    t.set_defaults(run=_tokenize)

    i = sub.add_parser("info", help="print the model and server information as JSON")
    _connection_flags(i, 300.0, "deadline of the call, seconds (default: 300)")
    i.set_defaults(run=_info)

    h = sub.add_parser("health", help="exit 0 if the server reports SERVING (grpc.health.v1; for probes)")
    _connection_flags(h, 3.0, "deadline of the check, seconds (default: 3)")
    h.set_defaults(run=_health)


def run_bench(argv: list[str]) -> int:
    """`llmserve bench ...`: the load generator shipped in this package (llmserve.client.loadgen)."""
    from . import loadgen

    sys.argv = ["llmserve bench", *argv]
    loadgen.main()
    return 0


def _targets(address: str) -> str | list[str]:
    """A comma-separated list of host:port (no scheme) becomes a list of addresses."""
    return address.split(",") if "," in address and ":/" not in address and not address.startswith("ipv") else address


def connect(args: argparse.Namespace) -> Client:
    """A client for the connection flags; raises ValueError/OSError for bad ones."""
    return Client(
        _targets(args.address),
        timeout=None if getattr(args, "per_turn_timeout", False) else args.timeout,
        api_key=args.api_key,
        tls=args.tls,
        root_certificates=args.tls_ca,
        client_cert=args.tls_client_cert,
        client_key=args.tls_client_key,
        server_name=args.tls_server_name,
        wait_for_ready=True if args.wait_for_ready else False,  # a command fails fast by default
    )


def run(args: argparse.Namespace) -> int:
    """Run a client command: 0 done, 1 the server refused or failed, 2 bad flags, 130 Ctrl-C."""
    try:
        client = connect(args)
    except (EnvError, ValueError, OSError) as exc:  # e.g. an unreadable certificate, a name that does not resolve
        print(f"llmserve {args.command}: {exc}", file=sys.stderr)
        return 2
    try:
        with client:
            return int(args.run(client, args) or 0)
    except LLMServeError as err:
        print(f"llmserve: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _generate(client: Client, args: argparse.Namespace) -> None:
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    sampling = {k: v for k, v in (("temperature", args.temperature), ("seed", args.seed)) if v is not None}
    for response in client.stream(prompt, max_tokens=args.max_tokens, stop=args.stop, **sampling):
        if args.json:
            print(json_format.MessageToJson(response, indent=None), flush=True)
        elif response.HasField("chunk"):
            print(response.chunk.text, end="", flush=True)
        else:
            end = response.turn_end
            reason = json_format.MessageToDict(end).get("finishReason", "")
            print(f"\n[{reason}: {end.usage.completion_tokens} tokens, "
                  f"{end.timings.decode_tokens_per_second:.1f} tok/s]", file=sys.stderr)


def _tokenize(client: Client, args: argparse.Namespace) -> None:
    from llmserve.v1 import llmserve_pb2 as pb

    request = pb.TokenizeRequest(
        text=args.text, add_special=True, parse_special=True, with_pieces=True, embedding_model=args.embedding_model
    )
    reply = client._unary(client.stub.Tokenize, request, None)
    print(json.dumps({"ids": list(reply.ids), "pieces": [p.decode("utf-8", "replace") for p in reply.pieces]}))


def _info(client: Client, args: argparse.Namespace) -> None:
    print(json_format.MessageToJson(client.model_info(), indent=2))


def _health(client: Client, args: argparse.Namespace) -> int:
    status = client.health_status(timeout=args.timeout)
    print(f"{args.address}: {status}")
    return 0 if status == "SERVING" else 1

