"""Prefix affinity without a key (`derive_affinity=True`): a Generate call whose caller
set no `affinity_key` and no `session_id` is sent with a key derived from the stable
head of its input, so that
a load balancer hashing `x-llmserve-affinity` (the project's Envoy config: Maglev with
bounded load) sends calls that share that head to the replica whose KV cache holds it.

The head is what later calls repeat:
* chat messages: the system messages and the first user message (a conversation's
  later turns keep them, and so does every question a tenant asks about one document);
* text: its first HEAD_CHARS characters;
* token ids: the first HEAD_TOKENS.

The key is "h-" and 16 hex digits of its SHA-256: bounded, and it reveals nothing of
the prompt. Calls with different heads spread as any hash spreads them.
"""

from __future__ import annotations

import hashlib

from llmserve.v1 import llmserve_pb2 as pb

HEAD_CHARS = 1024
HEAD_TOKENS = 256


def head_of(prompt: pb.Input) -> bytes:
    kind = prompt.WhichOneof("kind")
    if kind == "messages":
        head: list[pb.ChatMessage] = []
        for message in prompt.messages.messages:
            head.append(message)
            if message.role == "user":
                break
        return b"\0".join(f"{m.role}\n{m.content}".encode() for m in head)
    if kind == "tokens":
        ids = prompt.tokens.ids[:HEAD_TOKENS]
        return b"tokens:" + b",".join(str(t).encode() for t in ids) if ids else b""
    return prompt.text[:HEAD_CHARS].encode()


def prefix_affinity_key(prompt: pb.Input) -> str:
    """The key for `prompt`'s head ("" for an empty input)."""
    head = head_of(prompt)
    return f"h-{hashlib.sha256(head).hexdigest()[:16]}" if head else ""
