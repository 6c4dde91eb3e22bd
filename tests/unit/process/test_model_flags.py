"""`-m/--model [NAME=]PATH`, repeatable (model_settings.py), and the further models' metrics
shown with a `model_name` label (metrics.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from llmserve.service import cli
from llmserve.service.metrics import Metrics
from llmserve.service.model_settings import NamedModel, parse_named_model
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families


def _files(tmp_path: Path, *names: str) -> list[Path]:
    paths = [tmp_path / name for name in names]
    for path in paths:
        path.write_bytes(b"GGUF")
    return paths


def test_the_first_model_is_the_default_and_each_further_one_is_named(tmp_path: Path) -> None:
    base, other, third = _files(tmp_path, "base.gguf", "other-q8.gguf", "third.gguf")
    config = cli.build_config(cli.parse_args(["serve", "-m", f"main={base}", "--model", f"q8={other}", "-m", str(third),
                                              "--models-max", "2"]))
    assert config.model_path == base and config.alias == "main" and config.models.models_max == 2
    assert config.models.extra == (NamedModel("q8", other), NamedModel("third", third))
    plain = cli.build_config(cli.parse_args(["serve", "-m", str(base)]))
    assert plain.model_path == base and plain.alias is None and plain.models.extra == ()


def test_a_further_model_takes_its_own_context_size_and_slots(tmp_path: Path) -> None:
    base, other, third = _files(tmp_path, "base.gguf", "other.gguf", "a,b.gguf")
    config = cli.build_config(cli.parse_args(["serve", "-m", str(base), "-c", "4096", "-np", "4",
                                              "-m", f"q8={other},c=8192,np=2", "-m", f"t={third},parallel=8"]))
    assert config.models.extra == (NamedModel("q8", other, 8192, 2), NamedModel("t", third, None, 8))
    assert config.n_ctx == 4096 and config.n_parallel == 4  # the default model's
    for bad in (f"q8={other},foo=1", f"q8={other},np=0", f"q8={other},c=x"):
        with pytest.raises(SystemExit):
            cli.parse_args(["serve", "-m", str(base), "-m", bad])
    with pytest.raises(SystemExit):  # the default model's shape is -c/-np
        cli.parse_args(["serve", "-m", f"{base},c=2048"])
    with pytest.raises(ValueError, match="--model q8=.*fewer than 16 tokens per slot"):
        cli.build_config(cli.parse_args(["serve", "-m", str(base), "-m", f"q8={other},c=64,np=8"]))


def test_a_path_with_an_equals_sign_in_a_folder_is_a_path() -> None:
    assert parse_named_model("/models/a=b/x.gguf") == (None, Path("/models/a=b/x.gguf"))
    assert parse_named_model("q8=/m/x.gguf") == ("q8", Path("/m/x.gguf"))
    with pytest.raises(ValueError, match="NAME"):
        parse_named_model("bad name=/m/x.gguf")


@pytest.mark.parametrize("flags", [
    ["-m", "{base}", "-m", "x={missing}"],  # no such file
    ["-m", "x={base}", "-m", "x={other}"],  # the default's alias
    ["-m", "{base}", "-m", "x={other}", "-m", "x={base}"],  # two alike
    ["-m", "{base}", "-m", "mild={other}", "--lora", "mild={other}"],  # an adapter's name
    ["-m", "{base}", "-m", "x={other}", "--models-max", "1"],  # no room for a further model
])
def test_a_further_model_needs_a_file_and_a_name_of_its_own(tmp_path: Path, flags: list[str]) -> None:
    base, other = _files(tmp_path, "base.gguf", "other.gguf")
    argv = [f.format(base=base, other=other, missing=tmp_path / "missing.gguf") for f in flags]
    with pytest.raises(ValueError, match="--model x=|--model mild=|--models-max"):
        cli.build_config(cli.parse_args(["serve", *argv]))


def test_a_further_models_samples_join_the_families_with_its_name() -> None:
    server, other = Metrics(), Metrics()
    server.add_model("q8", other)
    server.turns.labels("STOP").inc()
    other.turns.labels("STOP").inc(3)
    exposed = server.exposed()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(generate_latest(exposed).decode()) for s in family.samples}
    assert samples[("llmserve_turns_total", (("finish_reason", "STOP"),))] == 1
    assert samples[("llmserve_turns_total", (("finish_reason", "STOP"), ("model_name", "q8")))] == 3
    assert not any(name.startswith("process_") and dict(labels).get("model_name") for name, labels in samples)
