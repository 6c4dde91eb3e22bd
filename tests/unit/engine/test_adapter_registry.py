"""The rules around LoRA adapters that need no model: flag parsing, names and scales,
the --adapter-dir confinement, llama-server's `lora` field."""

from __future__ import annotations

from pathlib import Path

import pytest
from llmserve.service.config import AdapterSettings, LoraSpec, parse_lora
from llmserve.service.domain.errors import InvalidRequest, PreconditionFailed
from llmserve.service.engine.adapter_registry import AdapterRegistry
from llmserve.service.http.adapters import lora_field
from llmserve.service.http.errors import ApiError
from llmserve.service.model.adapters import AdapterFile


def test_lora_flags_take_both_spellings() -> None:
    assert parse_lora("tuned=/a/b.gguf:0.5,/c/other.gguf") == [LoraSpec("tuned", Path("/a/b.gguf"), 0.5),
                                                              LoraSpec("other", Path("/c/other.gguf"), 1.0)]
    assert parse_lora("/x/y.gguf:2", scaled=True) == [LoraSpec("y", Path("/x/y.gguf"), 2.0)]
    with pytest.raises(ValueError, match="PATH:SCALE"):
        parse_lora("/x/y.gguf", scaled=True)
    with pytest.raises(ValueError, match="not a number"):
        parse_lora("a=/x/y.gguf:half")


def test_adapter_settings_refuse_what_cannot_run(tmp_path: Path) -> None:
    file = tmp_path / "a.gguf"
    file.write_bytes(b"x")
    with pytest.raises(ValueError, match="must differ"):
        AdapterSettings((LoraSpec("a", file), LoraSpec("a", file))).validate()
    with pytest.raises(ValueError, match="no such file"):
        AdapterSettings((LoraSpec("a", tmp_path / "none.gguf"),)).validate()
    with pytest.raises(ValueError, match="--max-loras"):
        AdapterSettings((LoraSpec("a", file),), max_loras=0).validate()
    with pytest.raises(ValueError, match="--adapter-dir"):
        AdapterSettings(allow_adapter_updates=True).validate()


def _registry(tmp_path: Path, allow: bool = True) -> AdapterRegistry:
    registry = AdapterRegistry("gemma3", 4, tmp_path, allow, submit=lambda command: None)
    registry.add("tuned", tmp_path / "t.gguf", 0.5, AdapterFile(tmp_path / "t.gguf", 8, 16.0, 4, 100))
    return registry


def test_an_alora_runs_alone_and_its_set_carries_its_invocation(tmp_path: Path) -> None:
    registry = _registry(tmp_path)
    registry.add("act", tmp_path / "a.gguf", 1.0, AdapterFile(tmp_path / "a.gguf", 8, 16.0, 4, 100, (7, 8)))
    assert registry.invocation(registry.resolve([("act", None)])) == (7, 8)
    assert registry.invocation(registry.resolve([("tuned", None)])) == () and registry.invocation(()) == ()
    with pytest.raises(InvalidRequest, match="aLoRA adapter runs alone"):
        registry.resolve([("act", None), ("tuned", None)])


def test_names_and_scales_resolve_to_one_spelling(tmp_path: Path) -> None:
    registry = _registry(tmp_path)
    assert registry.resolve([("tuned", None)]) == (("tuned", 0.5),)  # the adapter's own scale
    assert registry.resolve([("tuned", 0.0)]) == ()  # scale 0: the base
    assert registry.by_id(0) == "tuned" and registry.by_id(1) is None
    for pairs, words in (([("nope", None)], "no LoRA adapter named 'nope'"), ([("tuned", 1), ("tuned", 2)], "twice"),
                         ([("tuned", 1e9)], "outside")):
        with pytest.raises(InvalidRequest, match=words):
            registry.resolve(pairs)


def test_run_time_loads_read_only_under_the_adapter_dir(tmp_path: Path) -> None:
    inside = tmp_path / "inside"
    inside.mkdir()
    (inside / "ok.gguf").write_bytes(b"x")
    (tmp_path / "secret.gguf").write_bytes(b"x")
    (inside / "link.gguf").symlink_to(tmp_path / "secret.gguf")
    registry = _registry(inside)
    assert registry.adapter_path("ok.gguf") == (inside / "ok.gguf").resolve()
    assert registry.adapter_path(str(inside / "ok.gguf")) == (inside / "ok.gguf").resolve()
    for path in ("../secret.gguf", str(tmp_path / "secret.gguf"), "link.gguf"):
        with pytest.raises(InvalidRequest, match="outside --adapter-dir"):
            registry.adapter_path(path)
    with pytest.raises(PreconditionFailed, match="--allow-adapter-updates"):
        _registry(inside, allow=False).adapter_path("ok.gguf")


def test_the_lora_field_is_checked_for_shape() -> None:
    assert lora_field([{"id": 0, "scale": 0.5}, {"name": "b"}]) == ((0, 0.5), ("b", None))
    for value in ("x", [{"scale": 1}], [{"id": 0, "name": "a"}], [{"id": True}], [{"id": 0, "scale": "big"}],
                  [{"id": 0, "extra": 1}], [{"id": i} for i in range(17)]):
        with pytest.raises(ApiError):
            lora_field(value)
