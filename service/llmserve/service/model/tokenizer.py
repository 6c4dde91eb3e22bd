"""A loaded model's vocabulary and metadata: the tokenizer and `ModelMeta`.

Both read only immutable model data, so they are safe from any thread (the
servicer tokenizes on the event loop while the executor decodes). The generative
model and a separate embedding model (`--embedding-model`) each have one.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np

from ..domain.model_meta import ModelMeta

POOLING_NAMES = {-1: "unspecified", 0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}


class Vocab:
    """Tokenize and render tokens with one model's vocabulary."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.ptr = llama_cpp.llama_model_get_vocab(model)
        self.n_tokens = int(llama_cpp.llama_vocab_n_tokens(self.ptr))
        self._pieces: dict[int, bytes] = {}

    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        data = text.encode("utf-8")
        capacity = len(data) + 8
        while True:
            buf = (llama_cpp.llama_token * capacity)()
            n = llama_cpp.llama_tokenize(self.ptr, data, len(data), buf, capacity, add_special, parse_special)
            if n >= 0:  # numpy: slicing a ctypes array builds the list in Python, seconds for MBs
                return np.frombuffer(buf, dtype=np.int32, count=n).tolist()
            capacity = -n

    def piece(self, token: int, special: bool = False) -> bytes:
        """The bytes of one token (cached: the executor renders every token once per use)."""
        key = token if not special else ~token
        cached = self._pieces.get(key)
        if cached is None:
            buf = ctypes.create_string_buffer(64)
            n = llama_cpp.llama_token_to_piece(self.ptr, token, buf, len(buf), 0, special)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = llama_cpp.llama_token_to_piece(self.ptr, token, buf, len(buf), 0, special)
            cached = self._pieces[key] = buf.raw[:n]
        return cached

    def detokenize(self, tokens: list[int], special: bool) -> str:
        return b"".join(self.piece(t, special) for t in tokens).decode("utf-8", "replace")

    @property
    def adds_eos(self) -> bool:
        """Tokenizing with specials appends EOS/SEP (BERT-style encoders)."""
        return bool(llama_cpp.llama_vocab_get_add_eos(self.ptr))

    @property
    def eos(self) -> int:
        return int(llama_cpp.llama_vocab_eos(self.ptr))

    def meta_str(self, key: str) -> str:
        buf = ctypes.create_string_buffer(512)
        n = llama_cpp.llama_model_meta_val_str(self.model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace") if n >= 0 else ""

    def pooling(self, meta: ModelMeta) -> int:
        """The pooling the GGUF declares (`<arch>.pooling_type`, llama_pooling_type); NONE
        when it declares none, as a generative model does."""
        value = self.meta_str(f"{meta.architecture}.pooling_type")
        return int(value) if value.lstrip("-").isdigit() else llama_cpp.LLAMA_POOLING_TYPE_NONE

    def pools(self, meta: ModelMeta) -> bool:
        """An embedding model (or a reranker): its GGUF declares how its vectors are pooled."""
        return self.pooling(meta) > llama_cpp.LLAMA_POOLING_TYPE_NONE

    def read_meta(self, path: Path) -> ModelMeta:
        model, ptr = self.model, self.ptr
        template = llama_cpp.llama_model_chat_template(model, None)
        eog = tuple(t for t in range(self.n_tokens) if llama_cpp.llama_vocab_is_eog(ptr, t))
        return ModelMeta(
            name=self.meta_str("general.name") or path.stem,
            path=str(path),
            architecture=self.meta_str("general.architecture"),
            num_parameters=int(llama_cpp.llama_model_n_params(model)),
            n_ctx_train=int(llama_cpp.llama_model_n_ctx_train(model)),
            n_embd=int(llama_cpp.llama_model_n_embd(model)),
            vocab_size=self.n_tokens,
            bos_token_id=int(llama_cpp.llama_vocab_bos(ptr)),
            eos_token_id=int(llama_cpp.llama_vocab_eos(ptr)),
            eog_token_ids=eog,
            add_bos=bool(llama_cpp.llama_vocab_get_add_bos(ptr)),
            chat_template=template.decode("utf-8", "replace") if template else None,
            n_swa=int(llama_cpp.llama_model_n_swa(model)),
            quantization=_file_type_name(self.meta_str("general.file_type")),
        )


def _file_type_name(value: str) -> str:
    """GGUF `general.file_type` as llama.cpp names it (15 -> "Q4_K_M")."""
    for name, number in vars(llama_cpp).items():
        if name.startswith("LLAMA_FTYPE_") and value.isdigit() and number == int(value):
            return name.removeprefix("LLAMA_FTYPE_").removeprefix("MOSTLY_").removeprefix("ALL_")
    return value or "unknown"


def load_model(path: Path) -> Any:
    """llama_model_load_from_file, or RuntimeError naming the file."""
    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), llama_cpp.llama_model_default_params())
    if not model:
        raise RuntimeError(f"failed to load model {path}")
    return model
