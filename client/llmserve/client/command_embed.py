"""`llmserve embed`: lines of files (or stdin) to JSONL vectors, streamed.

Input is read as the server takes it, never all at once: at most `IN_FLIGHT` inputs
are read ahead of the vectors received (their texts wait for the output lines), on
top of gRPC's flow control. Progress is a tqdm bar on stderr when it is a terminal.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
from collections import deque
from collections.abc import Iterable, Iterator
from pathlib import Path

from tqdm import tqdm

from .sync import Client

BATCH = 32  # inputs per EmbedRequest
IN_FLIGHT = 8 * BATCH  # inputs read but not answered yet, at most (must hold one batch)


class InFlight:
    """The texts sent and not answered yet, in order, and a cap on their number."""

    def __init__(self, limit: int = IN_FLIGHT) -> None:
        self._room = threading.Semaphore(limit)
        self._texts: deque[str] = deque()
        self._closed = threading.Event()

    def feed(self, texts: Iterable[str]) -> Iterator[str]:
        """Yield the texts (gRPC reads this in its own thread), waiting while the window is full."""
        for text in texts:
            while not self._room.acquire(timeout=0.2):
                if self._closed.is_set():  # the call is over: stop reading
                    return
            self._texts.append(text)
            yield text

    def answered(self) -> str:
        """The oldest unanswered text, now answered."""
        self._room.release()
        return self._texts.popleft()

    def close(self) -> None:
        self._closed.set()


def lines(files: list[Path]) -> Iterator[str]:
    """Non-empty lines, without their line break, one file after another (or stdin)."""
    for source in files or [None]:
        with source.open(encoding="utf-8") if source else contextlib.nullcontext(sys.stdin) as stream:
            for line in stream:
                if line.strip():
                    yield line.rstrip("\n")


def run_embed(client: Client, args: argparse.Namespace) -> None:
    window = InFlight()
    progress = tqdm(unit=" inputs", file=sys.stderr, disable=not sys.stderr.isatty(), dynamic_ncols=True)
    vectors = client.embed(window.feed(lines(args.files)), normalize=not args.no_normalize,
                           truncate=args.truncate, batch_size=BATCH)
    try:
        for index, vector in enumerate(vectors):
            row = {"index": index, "text": window.answered(), "embedding": [round(x, 6) for x in vector]}
            print(json.dumps(row), flush=True)
            progress.update(1)
    finally:
        window.close()
        progress.close()
