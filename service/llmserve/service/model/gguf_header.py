"""A GGUF file's header, read with ggml's own parser (`gguf_init_from_file`, metadata
only: milliseconds even for a model whose vocabulary is 262k strings, which a Python
parser takes seconds over). Every getter of gguf.h asserts the value's type (an abort,
not an error), so types are checked before each read.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from pathlib import Path

import llama_cpp  # noqa: F401 - loads libggml-base, whose symbols are used below

GGUF_TYPE_UINT32 = 4
GGUF_TYPE_FLOAT32 = 6
GGUF_TYPE_STRING = 8
GGUF_TYPE_ARRAY = 9
GGML_TYPE_NAMES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 28: "F64", 30: "BF16"}


class _InitParams(ctypes.Structure):
    _fields_ = [("no_alloc", ctypes.c_bool), ("ctx", ctypes.POINTER(ctypes.c_void_p))]


@functools.cache
def _ggml() -> ctypes.CDLL:
    lib = ctypes.CDLL("libggml-base.so.0")  # the copy libllama loaded (dlopen finds it by soname)
    lib.gguf_init_from_file.argtypes = [ctypes.c_char_p, _InitParams]
    lib.gguf_init_from_file.restype = ctypes.c_void_p
    lib.gguf_free.argtypes = [ctypes.c_void_p]
    lib.gguf_find_key.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.gguf_find_key.restype = ctypes.c_int64
    lib.gguf_get_kv_type.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    lib.gguf_get_val_str.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    lib.gguf_get_val_str.restype = ctypes.c_char_p
    lib.gguf_get_val_f32.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    lib.gguf_get_val_f32.restype = ctypes.c_float
    lib.gguf_get_arr_type.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    lib.gguf_get_arr_n.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    lib.gguf_get_arr_n.restype = ctypes.c_size_t
    lib.gguf_get_arr_data.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    lib.gguf_get_arr_data.restype = ctypes.c_void_p
    lib.gguf_get_n_tensors.argtypes = [ctypes.c_void_p]
    lib.gguf_get_n_tensors.restype = ctypes.c_int64
    lib.gguf_get_tensor_name.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    lib.gguf_get_tensor_name.restype = ctypes.c_char_p
    lib.gguf_get_tensor_type.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    lib.ggml_get_tensor.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.ggml_get_tensor.restype = ctypes.c_void_p
    lib.ggml_nrows.argtypes = [ctypes.c_void_p]
    lib.ggml_nrows.restype = ctypes.c_int64
    lib.ggml_free.argtypes = [ctypes.c_void_p]
    return lib


@dataclass(frozen=True)
class GgufHeader:
    strings: dict[str, str]  # the string values asked for that the file has
    floats: dict[str, float]
    tensor_types: dict[str, str]  # name -> ggml type name ("F16", ..., "type 42" when unnamed here)
    rows: dict[str, int]  # name -> rows (ne[1] x ne[2] x ne[3]) of the tensors asked for
    uint32_arrays: dict[str, tuple[int, ...] | None]  # the arrays asked for that the file has (None: not of uint32)


def read_header(path: Path, strings: tuple[str, ...], floats: tuple[str, ...] = (),
                rows_of: str = "", uint32_arrays: tuple[str, ...] = ()) -> GgufHeader | None:
    """The header's values for `strings` and `floats` keys (when of that type) and
    `uint32_arrays` keys, every tensor's type, and the rows of tensors whose name ends with
    `rows_of`; None: not a GGUF file."""
    lib = _ggml()
    tensors_ctx = ctypes.c_void_p()
    ctx = lib.gguf_init_from_file(str(path).encode(), _InitParams(True, ctypes.pointer(tensors_ctx)))
    if not ctx:
        return None
    try:
        found_strings = {key: lib.gguf_get_val_str(ctx, i).decode("utf-8", "replace") for key in strings
                         if (i := lib.gguf_find_key(ctx, key.encode())) >= 0 and lib.gguf_get_kv_type(ctx, i) == GGUF_TYPE_STRING}
        found_floats = {key: float(lib.gguf_get_val_f32(ctx, i)) for key in floats
                        if (i := lib.gguf_find_key(ctx, key.encode())) >= 0 and lib.gguf_get_kv_type(ctx, i) == GGUF_TYPE_FLOAT32}
        names = [lib.gguf_get_tensor_name(ctx, i) for i in range(lib.gguf_get_n_tensors(ctx))]
        types = {name.decode(): GGML_TYPE_NAMES.get(t, f"type {t}")
                 for name, t in zip(names, (lib.gguf_get_tensor_type(ctx, i) for i in range(len(names))))}
        rows = {name.decode(): int(lib.ggml_nrows(lib.ggml_get_tensor(tensors_ctx, name)))
                for name in names if rows_of and name.decode().endswith(rows_of) and tensors_ctx}
        arrays = {key: _uint32_array(lib, ctx, i) for key in uint32_arrays if (i := lib.gguf_find_key(ctx, key.encode())) >= 0}
        return GgufHeader(found_strings, found_floats, types, rows, arrays)
    finally:
        lib.gguf_free(ctx)
        if tensors_ctx:
            lib.ggml_free(tensors_ctx)


def _uint32_array(lib: ctypes.CDLL, ctx: int, key_id: int) -> tuple[int, ...] | None:
    if lib.gguf_get_kv_type(ctx, key_id) != GGUF_TYPE_ARRAY or lib.gguf_get_arr_type(ctx, key_id) != GGUF_TYPE_UINT32:
        return None
    n = lib.gguf_get_arr_n(ctx, key_id)
    return tuple((ctypes.c_uint32 * n).from_address(lib.gguf_get_arr_data(ctx, key_id))) if n else ()
