"""A second generative model for the several-models tests: the default model requantized
(Q4_K_M -> Q8_0 by default) with llama.cpp's own quantize API (`llama_model_quantize`,
`allow_requantize`). The same weights at another precision: another file, another size
and another quantization in ModelInfo, output close to the default's.

    python -m tools.requantize OUT.gguf [--type q8_0] [--base M.gguf]
"""

from __future__ import annotations

import argparse
import ctypes
import os
from pathlib import Path

FTYPES = {"q8_0": 7, "q4_0": 2, "q5_0": 8}  # llama.h enum llama_ftype (LLAMA_FTYPE_MOSTLY_*)


def requantize(base: Path, out: Path, kind: str = "q8_0") -> Path:
    """`out`, written once (an existing file is kept): `base` requantized to `kind`."""
    if out.exists():
        return out
    import llama_cpp  # the server's binding: a client-only install has no need of this tool

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[kind]
    params.allow_requantize = True
    params.nthread = os.cpu_count() or 1
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".partial")
    status = llama_cpp.llama_model_quantize(str(base).encode(), str(partial).encode(), ctypes.byref(params))
    if status != 0:
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"llama_model_quantize({base} -> {kind}) failed: {status}")
    partial.replace(out)  # whole or absent: a test never reads a half-written model
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--type", choices=sorted(FTYPES), default="q8_0")
    parser.add_argument("--base", type=Path, help="the model to requantize (default: the default model)")
    args = parser.parse_args()
    if args.base is None:
        from llmserve.service.model.default_model import default_model_path

        args.base = default_model_path()
    print(requantize(args.base, args.out, args.type))


if __name__ == "__main__":
    main()
