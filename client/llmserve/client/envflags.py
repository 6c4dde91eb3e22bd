"""Command-line options whose defaults come from LLMSERVE_* environment variables.

A variable is read when the parser is built but converted only after parsing, and
only for the subcommand that runs: a flag given on the command line wins without
the variable being looked at, and a bad value (`LLMSERVE_PORT=abc`) is a one-line
error naming the variable (`EnvError`, exit status 2) instead of a traceback.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

TRUE = frozenset({"1", "true", "yes", "on"})
FALSE = frozenset({"0", "false", "no", "off", ""})
EXIT_USAGE = 2  # argparse's status for a bad command line


class EnvError(ValueError):
    """An LLMSERVE_* variable holds a value its option cannot take."""


def env_name(long_flag: str) -> str:
    """`--ctx-size` -> `LLMSERVE_CTX_SIZE`."""
    return "LLMSERVE_" + long_flag.lstrip("-").upper().replace("-", "_")


def parse_bool(text: str) -> bool:
    word = text.strip().lower()
    if word in TRUE:
        return True
    if word in FALSE:
        return False
    raise ValueError(f"expected one of {', '.join(sorted(TRUE | FALSE - {''}))}")


class Deferred:
    """An option's default, decided after parsing (see `resolve`). `str()` is what --help shows."""

    def __init__(self, compute: Callable[[], Any], shown: Any) -> None:
        self.compute = compute
        self.shown = shown

    def __str__(self) -> str:
        return str(self.shown)


def from_env(env: str, convert: Callable[[str], Any] | None, default: Any) -> Deferred:
    """The variable's value converted, or `default` when it is unset."""
    raw = os.environ.get(env)

    def compute() -> Any:
        if raw is None:
            return default
        if convert is None:
            return raw
        try:
            return convert(raw)
        except (TypeError, ValueError) as exc:
            if convert is parse_bool:
                raise EnvError(f"{env}={raw!r} is not a valid boolean: {exc}") from None
            raise EnvError(f"{env}={raw!r} is not a valid {getattr(convert, '__name__', 'value')}") from None

    return Deferred(compute, raw if raw is not None else default)


class EnvFlags:
    """Adds options to a parser whose defaults may come from LLMSERVE_* variables."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser

    def add(self, *names: str, type: Callable[[str], Any] | None = str, default: Any = None, help: str = "") -> None:
        env = env_name(next(n for n in names if n.startswith("--")))
        self.parser.add_argument(*names, type=type, default=from_env(env, type, default), help=f"{help} [env {env}]")

    def switch(self, *names: str, help: str = "", default: Deferred | None = None) -> None:
        """A flag that turns something on; the variable takes 1/true/yes/on or 0/false/no/off."""
        env = env_name(next(n for n in names if n.startswith("--")))
        value = default if default is not None else from_env(env, parse_bool, False)
        self.parser.add_argument(*names, action="store_true", default=value, help=f"{help} [env {env}]")


def resolve(args: argparse.Namespace) -> argparse.Namespace:
    """Replace every option left at an environment default by its value; raises EnvError."""
    for name, value in vars(args).items():
        if isinstance(value, Deferred):
            setattr(args, name, value.compute())
    return args


def shown_default(action: argparse.Action) -> Any:
    """The default --help should print (None: print none)."""
    default = action.default
    if isinstance(default, Deferred):
        default = default.shown
    return None if default is None or default is False else default
