"""KV cache settings: cache data types, flash attention, and which combinations work.

llama.cpp stores V transposed unless flash attention is on, and a transposed V
cannot be quantized: a quantized V cache needs flash attention. With a quantized
K or V cache llama.cpp applies a Walsh-Hadamard rotation to K/V (and Q) by itself
when the head size is a multiple of 64 (`attn_rot_k`/`attn_rot_v` in
src/llama-kv-cache.cpp; gemma-3-270m's head size is 256), unless the environment
sets LLAMA_ATTN_ROT_DISABLE.
"""

from __future__ import annotations

CACHE_TYPES = {  # name -> ggml_type id (ggml.h)
    "f32": 0,
    "f16": 1,
    "bf16": 30,
    "q8_0": 8,
    "q4_0": 2,
    "q4_1": 3,
    "q5_0": 6,
    "q5_1": 7,
    "iq4_nl": 20,
}
UNQUANTIZED = {"f32", "f16", "bf16"}
FLASH_ATTN = {"auto": -1, "off": 0, "on": 1}
DEFAULT_PARALLEL = 4  # llama-server's auto value (with a unified KV cache)


def check_kv_config(cache_type_k: str, cache_type_v: str, flash_attn: str) -> None:
    """Raise ValueError for a combination llama.cpp cannot run."""
    for flag, value in (("--cache-type-k", cache_type_k), ("--cache-type-v", cache_type_v)):
        if value not in CACHE_TYPES:
            raise ValueError(f"{flag} {value}: expected one of {', '.join(CACHE_TYPES)}")
    if flash_attn not in FLASH_ATTN:
        raise ValueError(f"--flash-attn {flash_attn}: expected on, off or auto")
    if cache_type_v not in UNQUANTIZED and flash_attn == "off":
        raise ValueError(
            f"a quantized V cache (--cache-type-v {cache_type_v}) needs flash attention: "
            "use --flash-attn on or auto, or an f16 V cache"
        )
