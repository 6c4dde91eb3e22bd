"""`llmserve chat`: an interactive multi-turn session on one Generate stream.

The stream has no deadline; `--timeout` limits each turn (a turn past it is cancelled
in band and the conversation goes on), so a chat lasts as long as its user types.
"""

from __future__ import annotations

import argparse
import signal
import sys

from llmserve.v1 import llmserve_pb2 as pb

from .errors import DeadlineExceeded
from .requests import Prompt
from .sync import Client, Session


def run_chat(client: Client, args: argparse.Namespace) -> None:
    """One session; messages when the server has a chat template, plain text otherwise.
    Ctrl-C during a reply cancels that turn only; Ctrl-D (or Ctrl-C at the prompt) quits."""
    use_messages = client.model_info(timeout=args.timeout).features.chat
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
            prompt: Prompt
            if use_messages:
                messages = [{"role": "system", "content": pending_system}] if pending_system else []
                prompt = [*messages, {"role": "user", "content": line}]
                pending_system = None
            else:
                prompt = line + "\n"
            _reply(session, prompt, args.timeout)


def _reply(session: Session, prompt: Prompt, timeout: float | None) -> None:
    # During a reply Ctrl-C sends an in-band cancel: the turn ends CANCELLED and
    # the session (and its KV) stays. At the prompt it quits.
    previous = signal.signal(signal.SIGINT, lambda *_: session.cancel())
    try:
        for chunk in session.send(prompt, timeout=timeout):
            print(chunk.text, end="", flush=True)
    except DeadlineExceeded:
        print(f" [stopped: the turn took longer than {timeout:g} s]", end="")
    else:
        if session.turn_end is not None and session.turn_end.finish_reason == pb.FINISH_REASON_CANCELLED:
            print(" [stopped]", end="")
    finally:
        signal.signal(signal.SIGINT, previous)
    print(flush=True)
