"""Make LoRA adapters (GGUF) for a base model, as test data: no adapter for the default
model can be downloaded, so the project writes its own.

Each adapter is rank-`rank` A/B pairs for a few of the base's weight matrices in every
layer, drawn from a fixed seed (the same file each run), in llama.cpp's LoRA layout
(`general.type = adapter`, `adapter.type = lora`, `adapter.lora.alpha`, tensors
`<weight>.lora_a` [rank, n_in] and `<weight>.lora_b` [n_out, rank] in numpy order).
`strength` scales B: 0.02 nudges the output, 0.5 changes it visibly.

    python -m tools.make_adapters OUT_DIR            # the test set (see ADAPTERS)
    python -m tools.make_adapters OUT_DIR --base M.gguf
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class AdapterSpec:
    name: str
    seed: int
    rank: int
    strength: float
    targets: tuple[str, ...]  # weight names within a layer (blk.N.<target>.weight)
    dtype: str = "float16"  # the tensors' type (numpy's name)
    architecture: str | None = None  # another than the base's: a LoRA of the wrong model
    invocation_tokens: tuple[int, ...] = ()  # an aLoRA's (adapter.alora.invocation_tokens): it applies from them on


ADAPTERS = (
    AdapterSpec("strong", seed=1, rank=8, strength=0.5, targets=("attn_q", "attn_v", "ffn_up")),
    AdapterSpec("mild", seed=2, rank=4, strength=0.05, targets=("attn_v", "ffn_down")),
    AdapterSpec("other", seed=3, rank=8, strength=0.5, targets=("attn_k", "attn_output", "ffn_gate")),
)
# Files a server must refuse: F64 tensors (llama.cpp loads them, then its CPU matrix kernels
# crash the process at the first decode) and a LoRA of another architecture.
BROKEN_ADAPTERS = (
    AdapterSpec("f64", seed=4, rank=4, strength=0.05, targets=("attn_v",), dtype="float64"),
    AdapterSpec("llama-arch", seed=5, rank=4, strength=0.05, targets=("attn_v",), architecture="llama"),
)


def base_shapes(base: Path) -> tuple[str, dict[str, tuple[int, int]]]:
    """The base's architecture and its 2-D weights' (n_in, n_out) by tensor name."""
    import gguf

    reader = gguf.GGUFReader(str(base))
    arch = str(reader.fields["general.architecture"].contents())
    shapes = {t.name: (int(t.shape[0]), int(t.shape[1])) for t in reader.tensors if len(t.shape) == 2}
    return arch, shapes


def write_adapter(spec: AdapterSpec, arch: str, shapes: dict[str, tuple[int, int]], out: Path) -> Path:
    import gguf

    rng = np.random.default_rng(spec.seed)
    writer = gguf.GGUFWriter(str(out), spec.architecture or arch)
    writer.add_string("general.type", "adapter")
    writer.add_string("general.name", f"llmserve-test-{spec.name}")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", float(spec.rank))  # scale = alpha / rank = 1
    if spec.invocation_tokens:
        writer.add_key_value("adapter.alora.invocation_tokens", list(spec.invocation_tokens), gguf.GGUFValueType.ARRAY,
                             gguf.GGUFValueType.UINT32)  # as llama.cpp's convert_lora_to_gguf.py writes it
    names = sorted(n for n in shapes if n.startswith("blk.") and n.split(".")[2] in spec.targets)
    if not names:
        raise ValueError(f"the base has none of {spec.targets}")
    for name in names:
        n_in, n_out = shapes[name]
        a = (rng.standard_normal((spec.rank, n_in)) / np.sqrt(n_in)).astype(spec.dtype)
        b = (rng.standard_normal((n_out, spec.rank)) * spec.strength / np.sqrt(spec.rank)).astype(spec.dtype)
        base_name = name.removesuffix(".weight")
        writer.add_tensor(f"{base_name}.weight.lora_a", a)
        writer.add_tensor(f"{base_name}.weight.lora_b", b)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def make_all(out_dir: Path, base: Path, specs: tuple[AdapterSpec, ...] = ADAPTERS) -> dict[str, Path]:
    """Write every adapter of `specs` into `out_dir` (`<name>.gguf`), skipping those already there."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {spec.name: out_dir / f"{spec.name}.gguf" for spec in specs}
    missing = [spec for spec in specs if not paths[spec.name].exists()]
    if missing:
        arch, shapes = base_shapes(base)  # reading the base's header takes seconds (its vocabulary)
        for spec in missing:
            tmp = paths[spec.name].with_suffix(".tmp")
            write_adapter(spec, arch, shapes, tmp)
            tmp.replace(paths[spec.name])
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--base", type=Path, help="the base model (default: the default model)")
    args = parser.parse_args(argv)
    if args.base is None:
        from llmserve.service.model.default_model import default_model_path

        args.base = default_model_path()
    for name, path in make_all(args.out_dir, args.base).items():
        print(f"{name}\t{path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
