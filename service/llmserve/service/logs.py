"""structlog set-up: JSON lines on stderr (or console rendering for humans)."""

from __future__ import annotations

import logging
import sys

import structlog


def configure_logging(fmt: str = "json", verbose: bool = False) -> None:
    level = logging.DEBUG if verbose else logging.INFO
    renderer = structlog.dev.ConsoleRenderer() if fmt == "console" else structlog.processors.JSONRenderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
