"""Which chat template a server renders with (engine/startup.py `chat_template`): the flag's
file, else the GGUF's, else the one the package ships for the architecture, else none."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from llmserve.service.config import ServerConfig
from llmserve.service.engine.chat.chat import PACKAGED_TEMPLATES
from llmserve.service.engine.startup import chat_template

from .fake_runner import META, piece_of


class _Vocab:
    def piece(self, token: int, special: bool = False) -> bytes:
        return piece_of(token)


def test_the_flag_then_the_model_then_the_package_then_none(tmp_path: Path) -> None:
    own = tmp_path / "own.jinja"
    own.write_text("{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}")
    gemma = dataclasses.replace(META, architecture="gemma3")
    with_flag = chat_template(ServerConfig(chat_template_file=own), _Vocab(), gemma)  # type: ignore[arg-type]
    assert with_flag is not None and with_flag.origin == "file"
    in_model = chat_template(ServerConfig(), _Vocab(), dataclasses.replace(gemma, chat_template="{{ 'x' }}"))  # type: ignore[arg-type]
    assert in_model is not None and in_model.origin == "model"
    packaged = chat_template(ServerConfig(), _Vocab(), gemma)  # type: ignore[arg-type]
    assert packaged is not None and packaged.origin == "packaged"
    rendered = packaged.render([{"role": "user", "content": "Hi"}])
    assert "<start_of_turn>user\nHi<end_of_turn>" in rendered and rendered.endswith("<start_of_turn>model\n")
    assert chat_template(ServerConfig(), _Vocab(), META) is None  # type: ignore[arg-type]  # another architecture


def test_the_packaged_templates_are_package_data() -> None:
    pyproject = (Path(__file__).resolve().parents[3] / "pyproject.toml").read_text()
    for path in PACKAGED_TEMPLATES.values():
        assert path.is_file() and f'"engine/chat/templates/*{path.suffix}"' in pyproject
