"""A second model for the runs that serve several (`-m NAME=PATH`, docs/adapters.md): a Q8_0
requantization of the default model (tools/requantize.py), made once per machine."""

from __future__ import annotations

from pathlib import Path

from llmserve.service.model.default_model import cache_dir, default_model_path

from tools.requantize import requantize

OTHER_MODEL = "gemma-q8"  # the name the further model is served by


def other_model_path() -> Path:
    return requantize(default_model_path(), cache_dir() / "test-models" / "gemma-3-270m-q8_0.gguf")


def two_model_flags() -> list[str]:
    """The serve flags for the default model and OTHER_MODEL beside it."""
    return ["-m", str(default_model_path()), "-m", f"{OTHER_MODEL}={other_model_path()}"]
