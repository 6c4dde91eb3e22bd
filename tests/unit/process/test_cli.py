"""`llmserve serve` flags: llama-server names, defaults in --help, LLMSERVE_* variables."""

from __future__ import annotations

import subprocess
import sys

import pytest
from llmserve.client.envflags import EnvError
from llmserve.service import cli
from llmserve.service.config import ContextShiftSettings, KVCacheSettings, PrefillSettings, SpeculationSettings

FLAGS = [
    "--model", "--ctx-size", "--parallel", "--batch-size", "--ubatch-size", "--threads", "--host", "--port",
    "--embeddings", "--embedding-model", "--max-queue", "--max-input-tokens", "--max-message-bytes", "--shutdown-grace",
    "--drain-delay",
    "--metrics-port", "--metrics-host", "--tls-cert", "--tls-key", "--tls-client-ca", "--api-key",
    "--log-format", "--verbose", "--otlp-traces-endpoint", "--deterministic", "--store-kv",
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
    with pytest.raises(ValueError, match="--store-kv .* --session-dir"):
        cli.build_config(cli.parse_args(["serve", "--store-kv"]))


def test_settings_objects_are_built_from_the_flags_their_fields_are_named_after() -> None:
    flags = ["--spec-type", "ngram-simple", "--draft-max", "5", "--draft-min", "1", "--spec-ngram-size-n", "2",
             "--spec-max-rows", "9", "--prefill-budget", "7", "--max-itl-ms", "300",
             "-ctk", "q8_0", "-fa", "on", "-kvu", "--context-shift", "--keep", "3"]
    config = cli.build_config(cli.parse_args(["serve", *flags]))
    assert config.speculation == SpeculationSettings("ngram-simple", draft_max=5, draft_min=1, spec_ngram_size_n=2,
                                                     spec_max_rows=9)
    assert config.prefill == PrefillSettings(prefill_budget=7, max_itl_ms=300.0)
    assert config.kv_cache == KVCacheSettings(cache_type_k="q8_0", cache_type_v="f16", flash_attn="on", kv_unified=True)
    assert config.context_shift == ContextShiftSettings(context_shift=True, keep=3)
    plain = cli.build_config(cli.parse_args(["serve"]))
    assert (plain.speculation, plain.prefill, plain.kv_cache, plain.context_shift) == (
        SpeculationSettings(), PrefillSettings(), KVCacheSettings(), ContextShiftSettings())
    refused = ((["--draft-max", "-1"], "--draft-max, --draft-min"), (["--spec-type", "eagle"], "--spec-type eagle"),
               (["-ctv", "q8_0", "-fa", "off"], "needs flash attention"), (["--keep", "-1"], "--keep must be"),
               (["--deterministic", "-kvu"], "--deterministic needs one KV stream per slot"))
    for bad, message in refused:
        with pytest.raises(ValueError, match=message):
            cli.build_config(cli.parse_args(["serve", *bad]))


def test_client_commands_take_tls_settings_from_the_servers_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("LLMSERVE_TLS", "LLMSERVE_TLS_CERT", "LLMSERVE_ADDRESS", "LLMSERVE_HOST", "LLMSERVE_PORT"):
        monkeypatch.delenv(name, raising=False)
    args = cli.parse_args(["health"])
    assert (args.tls, args.address) == (False, "127.0.0.1:50051")
    monkeypatch.setenv("LLMSERVE_TLS_CERT", "/certs/server.crt")  # the server here speaks TLS
    monkeypatch.setenv("LLMSERVE_HOST", "::")
    monkeypatch.setenv("LLMSERVE_PORT", "6000")
    args = cli.parse_args(["health"])
    assert (args.tls, args.address) == (True, "127.0.0.1:6000")
    monkeypatch.setenv("LLMSERVE_TLS", "off")
    assert cli.parse_args(["info"]).tls is False
    assert cli.parse_args(["info", "--tls"]).tls is True
    monkeypatch.setenv("LLMSERVE_HOST", "10.0.0.7")
    monkeypatch.setenv("LLMSERVE_ADDRESS", "llm.example:443")
    assert cli.parse_args(["tokenize", "x"]).address == "llm.example:443"
    monkeypatch.delenv("LLMSERVE_ADDRESS")
    assert cli.parse_args(["tokenize", "x"]).address == "10.0.0.7:6000"


def test_environment_values_are_checked_only_for_the_command_that_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMSERVE_CTX_SIZE", "big")
    monkeypatch.setenv("LLMSERVE_ADDRESS", "127.0.0.1:1")
    assert cli.parse_args(["info"]).address == "127.0.0.1:1"  # serve's variable is not read
    with pytest.raises(EnvError, match="LLMSERVE_CTX_SIZE='big' is not a valid int"):
        cli.parse_args(["serve"])
    assert cli.parse_args(["serve", "-c", "1024"]).ctx_size == 1024  # the flag wins
    help_text = subprocess.run([sys.executable, "-m", "llmserve.service", "serve", "--help"],
                               capture_output=True, text=True, check=True).stdout
    assert "(default: big)" in " ".join(help_text.split())  # --help still works, and shows the value


def test_an_address_list_on_the_command_line() -> None:
    from llmserve.client.commands import _targets

    assert _targets("localhost:1,localhost:2") == ["localhost:1", "localhost:2"]
    assert _targets("ipv4:127.0.0.1:1,127.0.0.1:2") == "ipv4:127.0.0.1:1,127.0.0.1:2"  # a gRPC target as it is
    assert _targets("dns:///llm.example:50051") == "dns:///llm.example:50051"
