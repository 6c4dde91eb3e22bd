"""structlog set-up: JSON lines on stdout (console rendering on a TTY).

Every line of a call carries its request id (bound with structlog's contextvars
by the transport). llama.cpp's own log goes through the same logger.
"""

from __future__ import annotations

import logging
import sys

import structlog


def configure_logging(fmt: str = "auto", verbose: bool = False) -> None:
    level = logging.DEBUG if verbose else logging.INFO
    console = fmt == "console" or (fmt == "auto" and sys.stdout.isatty())
    renderer = structlog.dev.ConsoleRenderer() if console else structlog.processors.JSONRenderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stdout),
        cache_logger_on_first_use=True,
    )
