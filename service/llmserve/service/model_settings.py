"""Several generative models behind one endpoint: `-m/--model [NAME=]PATH`, repeatable.

The first `--model` is the default model (a call that names no model gets it; its NAME,
when given, is its alias). Each further one is another model, served by its NAME: with
its own context, executor thread and slots (served_models.py), by default the same
-c/-np/-t as the default; `NAME=PATH,c=N,np=N` gives it a context size and slots of its
own (llama-server's `-c/--ctx-size` and `-np/--parallel`). Read by the cli (parse),
ServerConfig.validate and served_models.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}")


_OPTION = re.compile(r"([a-z][a-z-]*)=(\S*)")
_SHAPE_KEYS = {"c": "n_ctx", "ctx-size": "n_ctx", "np": "n_parallel", "parallel": "n_parallel"}


@dataclass(frozen=True)
class NamedModel:
    name: str
    path: Path
    n_ctx: int | None = None  # its own -c (None: the server's)
    n_parallel: int | None = None  # its own -np (None: the server's)

    def shape(self, n_ctx: int, n_parallel: int) -> dict[str, int]:
        """Its context size and slots given the server's: ServerConfig fields, for `replace`."""
        return {"n_ctx": self.n_ctx or n_ctx, "n_parallel": self.n_parallel or n_parallel}


def parse_named_model(value: str) -> tuple[str | None, Path]:
    """`NAME=PATH` or `PATH` (a NAME holds no `/`): ValueError when NAME is not 1-64 of
    letters, digits and `._:-`."""
    name, sep, path = value.partition("=")
    if not sep or "/" in name:
        return None, Path(value)
    if not _NAME.fullmatch(name):
        raise ValueError(f"--model {value}: a model's NAME is 1 to 64 letters, digits, '.', '_', ':' or '-'")
    return name, Path(path)


def model_shape(value: str) -> tuple[str, dict[str, int]]:
    """`value` without its trailing `,KEY=N` options, and them as NamedModel fields (KEY:
    c/ctx-size, np/parallel); ValueError naming an unknown KEY or a value not a positive integer."""
    parts, shape = value.split(","), {}
    while len(parts) > 1 and (option := _OPTION.fullmatch(parts[-1])):
        key, number = option.groups()
        if key not in _SHAPE_KEYS or not number.isdigit() or int(number) < 1:
            raise ValueError(f"--model {value}: ,{parts[-1]} is not an option (c=N or ctx-size=N, np=N or "
                             "parallel=N, positive integers)")
        shape[_SHAPE_KEYS[key]] = int(number)
        parts.pop()
    return ",".join(parts), shape


@dataclass(frozen=True)
class ModelSettings:
    """The models served beside the default one (none: one model, as before)."""

    extra: tuple[NamedModel, ...] = ()
    models_max: int | None = None  # models resident at once, the default one included; None: all, loaded at start
    models_load_timeout_s: float = 60.0  # a call waits this long for its model to load (served_models.py)

    def validate(self, default_name: str | None, adapter_names: tuple[str, ...]) -> None:
        """Every extra model has a name no other model or adapter has, and a file; room for
        the default model and one more."""
        if self.models_max is not None and self.models_max < 2 or self.models_load_timeout_s <= 0:
            raise ValueError("--models-max must be at least 2 (the default model and one more), "
                             "--models-load-timeout positive")
        names = [model.name for model in self.extra]
        taken = {default_name, *adapter_names}
        for model in self.extra:
            if not model.path.is_file():
                raise ValueError(f"--model {model.name}={model.path}: no such file")
            if model.name in taken or names.count(model.name) > 1:
                raise ValueError(f"--model {model.name}=...: the name is taken (by another model, the default "
                                 "model's alias or a LoRA adapter); each model needs its own")
