"""Chat templates: the GGUF's `tokenizer.chat_template` (or `--chat-template-file`)
rendered with jinja2 in a sandbox, as Hugging Face transformers does.

A session that uses chat messages keeps the whole conversation on the server; each
turn the client sends only its new messages, the server appends the assistant's
replies, renders everything again, and the slot allocator reuses the KV prefix the
previous rendering left, so only the new tokens are prefilled.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..domain import InvalidRequest

MAX_MESSAGES = 1024


class TemplateError(ValueError):
    """The template itself (or the conversation, via raise_exception) was refused."""


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str


class ChatTemplate:
    def __init__(self, source: str, bos_token: str, eos_token: str, origin: str) -> None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise TemplateError(f"the chat template does not compile: {exc}") from None
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.origin = origin  # "model" or "file"

    @classmethod
    def from_file(cls, path: Path, bos_token: str, eos_token: str) -> ChatTemplate:
        return cls(path.read_text(encoding="utf-8"), bos_token, eos_token, "file")

    def render(self, messages: list[ChatMessage], add_generation_prompt: bool = True) -> str:
        """The prompt text; InvalidRequest when the template refuses the conversation."""
        try:
            return self._template.render(
                messages=[{"role": m.role, "content": m.content} for m in messages],
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                add_generation_prompt=add_generation_prompt,
            )
        except TemplateError as exc:
            raise InvalidRequest(f"the chat template refused the conversation: {exc}", field="input.messages") from None
        except jinja2.TemplateError as exc:
            raise InvalidRequest(f"the chat template failed: {exc}", field="input.messages") from None
