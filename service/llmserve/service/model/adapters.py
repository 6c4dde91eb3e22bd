"""LoRA adapters: checked, loaded into llama.cpp, applied to the generation context.

An adapter file's header is read first (`gguf_header.py`, ggml's parser): llama.cpp's loader
catches what it checks (type, architecture, tensor names and shapes against the base) and
returns NULL, but it accepts tensor types its CPU matrix kernels lack (an F64 LoRA loads
and then kills the process at the first decode), so only the types llama.cpp's
`convert_lora_to_gguf.py` writes pass: F32, F16, BF16, Q8_0.

`Adapters` holds the loaded ones (by name) and sets a set of them on the context
(`llama_set_adapters_lora`, which does nothing when the set is unchanged). Loading,
unloading and applying run on the executor thread: llama.cpp's model keeps a registry
of its adapters that the next graph reservation reads.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

import llama_cpp

from ..domain.errors import PreconditionFailed
from ..domain.requests import AdapterSet
from .gguf_header import read_header

ALLOWED_TENSOR_TYPES = frozenset({"F32", "F16", "BF16", "Q8_0"})
ALORA_KEY = "adapter.alora.invocation_tokens"
MAX_INVOCATION_TOKENS = 1024  # each aLoRA turn looks for it in its context (an invocation is a few tokens)


class AdapterFileError(PreconditionFailed):
    """A file that is not a LoRA adapter this server can load for its model."""


@dataclass(frozen=True)
class AdapterFile:
    """What the file says about itself."""

    path: Path
    rank: int
    alpha: float
    num_tensors: int
    size_bytes: int
    # aLoRA (activated LoRA): the token sequence from whose last occurrence in a session's
    # tokens the adapter applies (llama.cpp's `adapter.alora.invocation_tokens`); (): a LoRA
    invocation_tokens: tuple[int, ...] = ()


def check_adapter_file(path: Path, architecture: str) -> AdapterFile:
    """The file's facts, or AdapterFileError saying why llama.cpp must not load it."""
    header = read_header(path, ("general.type", "general.architecture", "adapter.type"), ("adapter.lora.alpha",),
                         rows_of=".lora_a", uint32_arrays=(ALORA_KEY,))
    if header is None:
        raise AdapterFileError(f"{path.name} is not a readable GGUF file")
    text = header.strings
    if text.get("general.type") != "adapter" or text.get("adapter.type") != "lora":
        raise AdapterFileError(f"{path.name} is not a LoRA adapter (general.type {text.get('general.type', '')!r}, "
                               f"adapter.type {text.get('adapter.type', '')!r})")
    if text.get("general.architecture") != architecture:
        raise AdapterFileError(f"{path.name} is for {text.get('general.architecture')!r}; the model is {architecture!r}")
    bad = sorted(set(header.tensor_types.values()) - ALLOWED_TENSOR_TYPES)
    if bad:
        raise AdapterFileError(f"{path.name} has tensors of type {', '.join(bad)}; "
                               f"a LoRA may use {', '.join(sorted(ALLOWED_TENSOR_TYPES))}")
    invocation = header.uint32_arrays.get(ALORA_KEY, ())
    if invocation is None or len(invocation) > MAX_INVOCATION_TOKENS:
        raise AdapterFileError(f"{path.name}: {ALORA_KEY} must be an array of at most {MAX_INVOCATION_TOKENS} "
                               "uint32 token ids")
    alpha = header.floats.get("adapter.lora.alpha", 0.0)
    return AdapterFile(path, max(header.rows.values(), default=0), alpha, len(header.tensor_types), path.stat().st_size,
                       invocation)


class Adapters:
    """The loaded adapters of one model and the set on its generation context."""

    def __init__(self, model: llama_cpp.llama_model_p, ctx: llama_cpp.llama_context_p, architecture: str) -> None:
        self.model = model
        self.ctx = ctx
        self.architecture = architecture
        self.loaded: dict[str, tuple[ctypes.c_void_p, AdapterFile]] = {}
        self.current: AdapterSet = ()

    def load(self, name: str, info: AdapterFile) -> AdapterFile:
        """Load the checked file (`check_adapter_file`, which may read for seconds: never on
        the executor thread) as adapter `name`; AdapterFileError when llama.cpp refuses it."""
        if name in self.loaded:
            raise AdapterFileError(f"an adapter named {name!r} is loaded already")
        handle = llama_cpp.llama_adapter_lora_init(self.model, str(info.path).encode())
        if not handle:
            raise AdapterFileError(f"llama.cpp refused {info.path.name} (not a LoRA of this base model: "
                                   "its log says why)")
        self.loaded[name] = (handle, info)
        return info

    def unload(self, name: str) -> AdapterFile:
        """Free adapter `name` (returns its file); the context drops it first if it is in the current set."""
        if any(n == name for n, _ in self.current):
            self.use(())
        handle, info = self.loaded.pop(name)
        llama_cpp.llama_adapter_lora_free(handle)
        return info

    def use(self, adapters: AdapterSet) -> None:
        """Set `adapters` (loaded names) on the context; nothing when it holds them already."""
        if adapters == self.current:
            return
        n = len(adapters)
        handles = (llama_cpp.llama_adapter_lora_p_ctypes * n)(*(self.loaded[name][0] for name, _ in adapters))
        scales = (ctypes.c_float * n)(*(scale for _, scale in adapters))
        llama_cpp.llama_set_adapters_lora(self.ctx, handles if n else None, n, scales if n else None)
        self.current = adapters

    def close(self) -> None:
        self.use(())
        for name in list(self.loaded):
            self.unload(name)
