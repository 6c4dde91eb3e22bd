"""`llmserve` client commands: generate, embed, tokenize, info (the server's CLI adds them)."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

from google.protobuf import json_format
from llmserve.v1 import llmserve_pb2 as pb

from .errors import LLMServeError
from .sync import Client


def add_commands(sub: argparse._SubParsersAction, default_address: str) -> None:  # type: ignore[type-arg]
    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--address", default=default_address, help="server address (host:port)")
        p.add_argument("--api-key", default=None, help="sent as authorization: Bearer <key>")
        p.add_argument("--timeout", type=float, default=300.0, help="deadline of the call, seconds")

    g = sub.add_parser("generate", help="generate text; tokens are printed as they arrive")
    common(g)
    g.add_argument("prompt", help="the prompt (use - to read it from stdin)")
    g.add_argument("-n", "--max-tokens", type=int, default=128)
    g.add_argument("--temperature", type=float, default=None)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    g.add_argument("--json", action="store_true", help="print one JSON object per response instead of text")
    g.set_defaults(run=_generate)

    e = sub.add_parser("embed", help="embed lines of files (or stdin) into JSONL")
    common(e)
    e.add_argument("files", nargs="*", type=Path, help="text files, one input per line (default: stdin)")
    e.add_argument("--no-normalize", action="store_true")
    e.add_argument("--truncate", action="store_true", help="cut inputs longer than one ubatch")
    e.set_defaults(run=_embed)

    c = sub.add_parser("chat", help="interactive multi-turn chat on one stream (Ctrl-C stops a reply)")
    common(c)
    c.add_argument("-n", "--max-tokens", type=int, default=256)
    c.add_argument("--temperature", type=float, default=0.7)
    c.add_argument("--system", default=None, help="system message (chat-template servers)")
    c.set_defaults(run=_chat)

    sub.add_parser("bench", help="load test a server (llmserve bench --help for its flags)", add_help=False)

    t = sub.add_parser("tokenize", help="print the token ids (and pieces) of a text")
    common(t)
    t.add_argument("text")
    t.add_argument("--embedding-model", action="store_true", help="with the vocabulary Embed uses")
    t.set_defaults(run=_tokenize)

    i = sub.add_parser("info", help="print the model and server information as JSON")
    common(i)
    i.set_defaults(run=_info)


def run_bench(argv: list[str]) -> int:
    """`llmserve bench ...`: the load generator shipped in this package (llmserve.client.loadgen)."""
    from . import loadgen

    sys.argv = ["llmserve bench", *argv]
    loadgen.main()
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        with Client(args.address, timeout=args.timeout, api_key=args.api_key) as client:
            args.run(client, args)
        return 0
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


def _chat(client: Client, args: argparse.Namespace) -> None:
    """One session; messages when the server has a chat template, plain text otherwise.
    Ctrl-C during a reply cancels that turn only; Ctrl-D (or Ctrl-C at the prompt) quits."""
    use_messages = client.model_info().features.chat
    mode = "chat template" if use_messages else "plain text (the server has no chat template)"
    print(f"llmserve chat — {mode}. Ctrl-C stops a reply, Ctrl-D quits.", file=sys.stderr)
    pending_system = args.system
    with client.session(max_tokens=args.max_tokens, temperature=args.temperature) as session:
        while True:
            try:
                line = input("> ")
            except (EOFError, KeyboardInterrupt):
                print(file=sys.stderr)
                return
            if not line.strip():
                continue
            if use_messages:
                messages = ([{"role": "system", "content": pending_system}] if pending_system else [])
                prompt: object = messages + [{"role": "user", "content": line}]
                pending_system = None
            else:
                prompt = line + "\n"
            # During a reply Ctrl-C sends an in-band cancel: the turn ends CANCELLED and
            # the session (and its KV) stays. At the prompt it quits.
            previous = signal.signal(signal.SIGINT, lambda *_: session.cancel())
            try:
                for chunk in session.send(prompt):  # type: ignore[arg-type]
                    print(chunk.text, end="", flush=True)
            finally:
                signal.signal(signal.SIGINT, previous)
            if session.turn_end is not None and session.turn_end.finish_reason == pb.FINISH_REASON_CANCELLED:
                print(" [stopped]", end="")
            print(flush=True)


def _lines(files: list[Path]) -> Iterator[str]:
    sources = [f.open(encoding="utf-8") for f in files] if files else [sys.stdin]
    for source in sources:
        for line in source:
            if line.strip():
                yield line.rstrip("\n")


def _embed(client: Client, args: argparse.Namespace) -> None:
    texts = list(_lines(args.files))
    show = sys.stderr.isatty() and len(texts) > 100
    for i, vector in enumerate(client.embed(texts, normalize=not args.no_normalize, truncate=args.truncate)):
        print(json.dumps({"index": i, "text": texts[i], "embedding": [round(x, 6) for x in vector]}))
        if show and (i + 1) % 50 == 0:
            done = (i + 1) / len(texts)
            print(f"\r[{'#' * int(30 * done):<30}] {i + 1}/{len(texts)}", end="", file=sys.stderr, flush=True)
    if show:
        print(file=sys.stderr)


def _tokenize(client: Client, args: argparse.Namespace) -> None:
    reply = client.stub.Tokenize(client_request(args.text, args.embedding_model), **client.options.call_kwargs())
    print(json.dumps({"ids": list(reply.ids), "pieces": [p.decode("utf-8", "replace") for p in reply.pieces]}))


def client_request(text: str, embedding_model: bool = False):  # type: ignore[no-untyped-def]
    from llmserve.v1 import llmserve_pb2 as pb

    return pb.TokenizeRequest(
        text=text, add_special=True, parse_special=True, with_pieces=True, embedding_model=embedding_model
    )


def _info(client: Client, args: argparse.Namespace) -> None:
    print(json_format.MessageToJson(client.model_info(), indent=2))
