"""An aLoRA file's invocation as the file check reads it (ggml's GGUF parser): llama.cpp's
`adapter.alora.invocation_tokens`, an array of uint32 token ids; any other type, or an
invocation longer than MAX_INVOCATION_TOKENS, is refused before llama.cpp sees the file."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest
from llmserve.service.model.adapters import ALORA_KEY, MAX_INVOCATION_TOKENS, AdapterFileError, check_adapter_file

from tools.make_adapters import AdapterSpec, write_adapter

SHAPES = {"blk.0.attn_v.weight": (16, 8)}


def _adapter(tmp_path: Path, invocation: tuple[int, ...] = ()) -> Path:
    spec = AdapterSpec("act", seed=1, rank=4, strength=0.1, targets=("attn_v",), invocation_tokens=invocation)
    return write_adapter(spec, "gemma3", SHAPES, tmp_path / "act.gguf")


def test_the_invocation_is_read_and_a_lora_has_none(tmp_path: Path) -> None:
    assert check_adapter_file(_adapter(tmp_path, (236743, 7, 8)), "gemma3").invocation_tokens == (236743, 7, 8)
    assert check_adapter_file(_adapter(tmp_path), "gemma3").invocation_tokens == ()


def test_an_invocation_of_another_type_or_too_long_is_refused(tmp_path: Path) -> None:
    with pytest.raises(AdapterFileError, match="at most"):
        check_adapter_file(_adapter(tmp_path, tuple(range(MAX_INVOCATION_TOKENS + 1))), "gemma3")
    path = tmp_path / "strings.gguf"
    writer = gguf.GGUFWriter(str(path), "gemma3")
    for key, value in (("general.type", "adapter"), ("adapter.type", "lora"), (ALORA_KEY, "Answer:")):
        writer.add_string(key, value)
    writer.add_float32("adapter.lora.alpha", 4.0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(AdapterFileError, match="uint32"):
        check_adapter_file(path, "gemma3")
