"""`llmserve` command line. Flags follow llama-server's names where the concept is the same."""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path

from .config import ServerConfig


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llmserve", description="Serve a GGUF model over gRPC.")
    sub = parser.add_subparsers(dest="command", required=True)
    d = ServerConfig()
    s = sub.add_parser("serve", help="run the gRPC server")
    s.add_argument("-m", "--model", type=Path, default=None, help="GGUF file (default: gemma-3-270m Q4_K_M from PyPI)")
    s.add_argument("-c", "--ctx-size", type=int, default=d.n_ctx, help="total KV context shared by all slots")
    s.add_argument("-np", "--parallel", type=int, default=d.n_parallel, help="number of slots (concurrent sessions)")
    s.add_argument("-b", "--batch-size", type=int, default=d.n_batch, help="logical batch size (tokens per step)")
    s.add_argument("-ub", "--ubatch-size", type=int, default=d.n_ubatch, help="physical batch size")
    s.add_argument("-t", "--threads", type=int, default=min(os.cpu_count() or 2, 8), help="CPU threads")
    s.add_argument("--host", default=d.host)
    s.add_argument("--port", type=int, default=d.port)
    s.add_argument("--embeddings", action="store_true", help="serve Embed (clamps the batch to one ubatch)")
    s.add_argument("--shutdown-grace", type=float, default=d.shutdown_grace_s, help="seconds to drain on SIGTERM")
    s.add_argument("--log-format", choices=("json", "console"), default=d.log_format)
    s.add_argument("-v", "--verbose", action="store_true", help="debug logs, including llama.cpp's")
    h = sub.add_parser("health", help="exit 0 if the server at --address reports SERVING")
    h.add_argument("--address", default=f"{d.host}:{d.port}")
    h.add_argument("--timeout", type=float, default=3.0)
    return parser


def _health(address: str, timeout: float) -> int:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout)
        except grpc.RpcError as err:
            print(f"{address}: {err.code().name}")
            return 1
    name = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    print(f"{address}: {name}")
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if args.command == "health":
        raise SystemExit(_health(args.address, args.timeout))
    config = ServerConfig(
        model_path=args.model,
        n_ctx=args.ctx_size,
        n_parallel=args.parallel,
        n_batch=args.batch_size,
        n_ubatch=args.ubatch_size,
        n_threads=args.threads,
        embeddings=args.embeddings,
        host=args.host,
        port=args.port,
        shutdown_grace_s=args.shutdown_grace,
        verbose=args.verbose,
        log_format=args.log_format,
    )
    try:
        config.validate()
    except ValueError as exc:
        raise SystemExit(f"llmserve: {exc}") from None

    from .logs import configure_logging
    from .server import serve

    configure_logging(config.log_format, config.verbose)
    asyncio.run(serve(config))


if __name__ == "__main__":
    main()
