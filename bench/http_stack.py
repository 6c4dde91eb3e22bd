"""Per-chunk cost of streaming SSE: aiohttp vs Starlette + uvicorn, on this machine.

Each stack serves one route that writes `--chunks` small `data: {...}\\n\\n` events, one
write per event (as the OpenAI wing writes one per token). The server runs in a child
process; the client here is the same raw asyncio socket reader for every stack, so the
difference is the server's. Reported per chunk: wall time (client, request to last byte)
and the server process's CPU time (what the chunks cost the machine the engine shares).

    python -m bench.http_stack [--chunks 10000] [--rounds 5] [--tick]

`--tick`: the server yields to the event loop before each event (`asyncio.sleep(0)`), as
events arriving one by one from the executor thread make it; without it the writes go
back to back.

Stacks: `aiohttp` (web.StreamResponse on the default asyncio loop: where the gRPC server
runs), `uvicorn-uvloop` (Starlette StreamingResponse, uvicorn with httptools and uvloop,
as it runs standalone) and `uvicorn-asyncio` (the same on the default loop: what it would
be inside llmserve's process, since grpc.aio owns that loop).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import time

from harness.server import free_port

STACKS = ("aiohttp", "uvicorn-uvloop", "uvicorn-asyncio")
EVENT = b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" tok"}}]}\n\n'


def _serve(stack: str, port: int, chunks: int, tick: bool) -> None:
    """The child: serve GET /stream and GET /cpu (this process's CPU seconds so far)."""

    def cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    if stack == "aiohttp":
        from aiohttp import web

        async def stream(request: web.Request) -> web.StreamResponse:
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await response.prepare(request)
            for _ in range(chunks):
                if tick:
                    await asyncio.sleep(0)
                await response.write(EVENT)
            await response.write_eof()
            return response

        async def cpu_route(request: web.Request) -> web.Response:
            return web.Response(text=str(cpu()))

        app = web.Application()
        app.router.add_get("/stream", stream)
        app.router.add_get("/cpu", cpu_route)
        web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)
        return

    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse, StreamingResponse
    from starlette.routing import Route

    async def events():  # type: ignore[no-untyped-def]
        for _ in range(chunks):
            if tick:
                await asyncio.sleep(0)
            yield EVENT

    async def stream_route(request):  # type: ignore[no-untyped-def]
        return StreamingResponse(events(), media_type="text/event-stream")

    async def cpu_starlette(request):  # type: ignore[no-untyped-def]
        return PlainTextResponse(str(cpu()))

    app = Starlette(routes=[Route("/stream", stream_route), Route("/cpu", cpu_starlette)])
    loop = "uvloop" if stack == "uvicorn-uvloop" else "asyncio"
    uvicorn.run(app, host="127.0.0.1", port=port, loop=loop, http="httptools", log_level="warning", access_log=False)


async def _get(port: int, path: str) -> tuple[bytes, float]:
    """A raw HTTP/1.1 GET that reads to the end (Connection: close): body bytes, seconds."""
    start = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    data = bytearray()
    while chunk := await reader.read(1 << 16):
        data += chunk
    seconds = time.perf_counter() - start
    writer.close()
    return bytes(data.partition(b"\r\n\r\n")[2]), seconds


async def _measure(stack: str, chunks: int, rounds: int, tick: bool) -> dict[str, float]:
    port = free_port()
    child = subprocess.Popen([sys.executable, "-m", "bench.http_stack", "--child", stack, "--port", str(port),
                              "--chunks", str(chunks), *(["--tick"] if tick else [])])
    try:
        for _ in range(100):
            try:
                await _get(port, "/cpu")
                break
            except OSError:
                await asyncio.sleep(0.1)
        await _get(port, "/stream")  # warm-up
        walls, cpus = [], []
        for _ in range(rounds):
            before = float(_cpu_text((await _get(port, "/cpu"))[0]))
            body, seconds = await _get(port, "/stream")
            after = float(_cpu_text((await _get(port, "/cpu"))[0]))
            assert body.count(b"data: ") == chunks, f"{stack}: {body.count(b'data: ')} events"
            walls.append(seconds / chunks * 1e6)
            cpus.append((after - before) / chunks * 1e6)
        return {"wall_us": statistics.median(walls), "server_cpu_us": statistics.median(cpus)}
    finally:
        child.terminate()
        child.wait()


def _cpu_text(body: bytes) -> str:
    """The /cpu body, whether chunked (uvicorn) or not."""
    text = body.decode().strip()
    lines = text.splitlines()
    return lines[1] if len(lines) > 1 and lines[0].isalnum() and "." not in lines[0] else text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--stacks", default=",".join(STACKS))
    parser.add_argument("--tick", action="store_true", help="yield to the loop before each event")
    parser.add_argument("--child", choices=STACKS, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _serve(args.child, args.port, args.chunks, args.tick)
        return
    results = {}
    for stack in args.stacks.split(","):
        results[stack] = asyncio.run(_measure(stack, args.chunks, args.rounds, args.tick))
        print(f"{stack:16s} wall {results[stack]['wall_us']:6.1f} µs/chunk   "
              f"server CPU {results[stack]['server_cpu_us']:6.1f} µs/chunk", flush=True)
    print(json.dumps({"chunks": args.chunks, "rounds": args.rounds, "tick": args.tick, "cpus": os.cpu_count(),
                      "results": results}))


if __name__ == "__main__":
    main()
