"""The several-models flags of `llmserve serve` (model_settings.py): `-m/--model
[NAME=]PATH[,c=N][,np=N]` repeatable, `--models-max`, `--models-load-timeout`."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from llmserve.client.envflags import EnvFlags, from_env

from .model_settings import ModelSettings, NamedModel, model_shape, parse_named_model


class _ModelAction(argparse.Action):
    """-m/--model [NAME=]PATH[,c=N][,np=N], repeatable: the first is the default model (NAME:
    its alias; -c/-np are its shape), each further one another model served by its NAME
    (default: the file's stem), with its own context size and slots when given."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        try:
            text, shape = model_shape(str(values))
            name, path = parse_named_model(text)
        except ValueError as exc:
            parser.error(str(exc))
        if namespace.model_given:
            namespace.extra_models = [*namespace.extra_models, NamedModel(name or path.stem, path, **shape)]
        elif shape:
            parser.error(f"--model {values}: the default model (the first --model) takes -c and -np")
        else:
            namespace.model_given, namespace.model, namespace.model_alias = True, path, name


def add_model_flags(serve: argparse.ArgumentParser, flags: EnvFlags) -> None:
    d = ModelSettings()
    serve.add_argument("-m", "--model", action=_ModelAction, metavar="[NAME=]PATH[,c=N][,np=N]",
                       default=from_env("LLMSERVE_MODEL", Path, None),
                       help="GGUF model file (default: gemma-3-270m Q4_K_M from PyPI); repeat for more models, each "
                            "served by its NAME, with its own ,c=N ,np=N if given (the first is the default; "
                            "docs/adapters.md) [env LLMSERVE_MODEL]")
    serve.set_defaults(model_given=False, extra_models=[], model_alias=None)
    flags.add("--models-max", type=int, help="models resident at once, the default one included: further models "
              "load when first named and the least recently used idle one unloads (default: all, loaded at start)")
    flags.add("--models-load-timeout", type=float, default=d.models_load_timeout_s,
              help="seconds a call waits for its model to load (then RESOURCE_EXHAUSTED / 429 with a retry hint)")


def model_settings(args: argparse.Namespace) -> ModelSettings:
    return ModelSettings(tuple(args.extra_models), args.models_max, args.models_load_timeout)
