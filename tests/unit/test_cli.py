"""`llmserve serve` flags: llama-server names, defaults in --help, LLMSERVE_* variables."""

from __future__ import annotations

import subprocess
import sys

import pytest
from llmserve.service import cli

FLAGS = [
    "--model", "--ctx-size", "--parallel", "--batch-size", "--ubatch-size", "--threads", "--host", "--port",
    "--embeddings", "--embedding-model", "--max-queue", "--max-input-tokens", "--max-message-bytes", "--shutdown-grace",
    "--metrics-port", "--metrics-host", "--tls-cert", "--tls-key", "--tls-client-ca", "--api-key",
    "--log-format", "--verbose", "--otlp-traces-endpoint",
]


def test_help_documents_every_flag_with_its_default_and_variable() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "llmserve.service", "serve", "--help"], check=True, capture_output=True, text=True
    ).stdout
    out = " ".join(out.split())  # argparse wraps lines
    for flag in FLAGS:
        assert flag in out, flag
        assert cli._env_name(flag) in out, flag
    for short in ("-m", "-c", "-np", "-b", "-ub", "-t"):
        assert f"{short} " in out or f"{short}," in out
    assert "(default: 8192)" in out and "(default: 64)" in out


def test_llama_server_short_flags() -> None:
    config = cli.build_config(cli.parse_args(["serve", "-c", "4096", "-np", "2", "-b", "256", "-ub", "128", "-t", "1", "--embeddings"]))
    assert (config.n_ctx, config.n_parallel, config.n_batch, config.n_ubatch, config.n_threads) == (4096, 2, 256, 128, 1)
    assert config.embeddings and config.n_batch_effective == 128  # clamped to the ubatch


def test_embedding_model_implies_embeddings_and_moves_the_clamp(tmp_path) -> None:  # type: ignore[no-untyped-def]
    gguf = tmp_path / "e.gguf"
    gguf.write_bytes(b"GGUF")
    config = cli.build_config(cli.parse_args(["serve", "-b", "2048", "-ub", "256", "--embedding-model", str(gguf)]))
    assert config.embeddings and config.embedding_model_path == gguf
    assert config.n_batch_effective == 2048  # generation keeps its batch; the embedding context is one ubatch
    with pytest.raises(ValueError, match="--embedding-model .*missing.gguf: no such file"):
        cli.build_config(cli.parse_args(["serve", "--embedding-model", str(tmp_path / "missing.gguf")]))


def test_environment_variables_and_flags_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMSERVE_CTX_SIZE", "2048")
    monkeypatch.setenv("LLMSERVE_EMBEDDINGS", "true")
    monkeypatch.setenv("LLMSERVE_API_KEY", "from-env")
    monkeypatch.setenv("LLMSERVE_MAX_QUEUE", "7")
    config = cli.build_config(cli.parse_args(["serve"]))
    assert (config.n_ctx, config.embeddings, config.api_key, config.max_queue) == (2048, True, "from-env", 7)
    assert cli.build_config(cli.parse_args(["serve", "-c", "1024"])).n_ctx == 1024


def test_tracing_is_off_unless_an_endpoint_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LLMSERVE_OTLP_TRACES_ENDPOINT", raising=False)
    assert cli.build_config(cli.parse_args(["serve"])).otlp_traces_endpoint is None
    monkeypatch.setenv("LLMSERVE_OTLP_TRACES_ENDPOINT", "")
    assert cli.build_config(cli.parse_args(["serve"])).otlp_traces_endpoint is None
    monkeypatch.setenv("LLMSERVE_OTLP_TRACES_ENDPOINT", "http://collector:4317")
    assert cli.build_config(cli.parse_args(["serve"])).otlp_traces_endpoint == "http://collector:4317"
    flag = ["serve", "--otlp-traces-endpoint", "https://other:4317"]
    assert cli.build_config(cli.parse_args(flag)).otlp_traces_endpoint == "https://other:4317"


def test_inconsistent_flags_are_refused() -> None:
    with pytest.raises(ValueError, match="--tls-cert and --tls-key"):
        cli.build_config(cli.parse_args(["serve", "--tls-cert", "a.pem"]))
    with pytest.raises(ValueError, match="per slot"):
        cli.build_config(cli.parse_args(["serve", "-c", "32", "-np", "4"]))
