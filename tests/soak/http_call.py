"""Sends one HTTP plan to the server's OpenAI API (aiohttp) and records what came back.

Each call runs on its own event loop in the fuzzer's worker thread, beside the gRPC
calls of a mixed run. A plan that ends by `disconnect` drops the connection after the
first chunk with text, as a client that goes away does. The outcome is translated
(tests/soak/http_translate.py) and judged by the same oracle as a gRPC call. A Responses
or Messages plan's stream is named events (tests/soak/responses_translate.py, messages_translate.py).
"""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
from llmserve.client import Client

from tests.soak.http_translate import APIS, HttpOutcome, request, to_record
from tests.soak.oracle import CallRecord
from tests.soak.plans import Plan

CALL_TIMEOUT = 300.0  # only a guard against hangs, as the gRPC calls'


def run_http_plan(base_url: str, plan: Plan) -> CallRecord:
    t_start = time.monotonic()
    outcome = asyncio.run(send(base_url, plan))
    return to_record(plan, outcome, t_start, time.monotonic())


async def send(base_url: str, plan: Plan) -> HttpOutcome:
    route, body = request(plan)
    out = HttpOutcome()
    headers = {"Content-Type": "application/json"}
    if plan.deadline_s is not None:
        headers["x-request-timeout"] = str(plan.deadline_s)
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=CALL_TIMEOUT)) as session, session.post(
                base_url + route, data=json.dumps(body), headers=headers) as resp:
            out.status, out.headers = resp.status, {k.lower(): v for k, v in resp.headers.items()}
            if resp.status != 200 or not plan.stream:
                out.body = json.loads(await resp.read())
                return out
            async for raw in resp.content:  # one line at a time
                line = raw.strip()
                if not line:
                    continue
                if plan.api != "openai" and line.startswith(b"event: "):
                    continue  # the event's name: its data says it again (`type`)
                if not line.startswith(b"data: ") or out.done:
                    out.events.append({"error": {"type": "client", "message": f"after [DONE] or not SSE: {line!r}"}})
                    continue
                if line == b"data: [DONE]":
                    out.done = True
                    continue
                event = json.loads(line[len(b"data: "):])
                out.events.append(event)
                out.done |= plan.api != "openai" and event.get("type") in APIS[plan.api].TERMINAL  # their [DONE]
                if plan.ending == "disconnect" and _has_text(event):
                    resp.close()  # the connection goes: the server must close the session
                    out.acted = True
                    return out
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        out.client_error = f"{type(exc).__name__}: {exc}"
    return out


def _has_text(event: dict) -> bool:  # type: ignore[type-arg]
    if event.get("type") == "response.output_text.delta":
        return bool(event.get("delta"))
    if event.get("type") == "content_block_delta":  # Anthropic's
        return bool(event.get("delta", {}).get("text"))
    return any((c.get("delta") or {}).get("content") or c.get("text") for c in event.get("choices", []))


def eog_pieces(address: str, eog_ids: list[int]) -> frozenset[str]:
    """The texts the HTTP wing's logprobs give the end-of-generation tokens (special tokens rendered)."""
    with Client(address, timeout=30) as client:
        return frozenset(client.detokenize([t], render_special=True) for t in eog_ids)
