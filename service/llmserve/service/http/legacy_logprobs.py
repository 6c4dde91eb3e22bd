"""OpenAI's legacy (`/v1/completions`) logprobs of one choice:
`{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`, one entry per token.

`top_logprobs` maps each alternative's text to its logprob (the `logprobs` int asks for
that many). `text_offset` is where the token starts in the choice's text, the echoed
prompt included. With `echo`, the prompt's tokens come first, scored by the tokens before
them: the first prompt token has nothing before it and is left out (for a text prompt
it is BOS); their offsets end where the prompt's text ends.
"""

from __future__ import annotations

from collections.abc import Callable

from ..domain.events import PromptLogprobsEvent, TokenEvent, TokenLogprob

Entry = tuple[str, float, dict[str, float], int]  # token, logprob, alternatives, text offset


class LegacyLogprobs:
    def __init__(self, piece_of: Callable[[int], str], echoed_prompt: str) -> None:
        """`piece_of`: a token id's text; `echoed_prompt`: the prompt text the choice starts with ("" without echo)."""
        self._piece_of = piece_of
        self._echoed_prompt = echoed_prompt
        self._prompt: list[TokenLogprob] = []
        self._prompt_done = False
        self._entries: list[Entry] = []
        self._offset = len(echoed_prompt)
        self._num_taken = 0

    def add_prompt(self, event: PromptLogprobsEvent) -> None:
        """Scored prompt tokens (they all come before the first token of the reply)."""
        self._prompt += event.tokens

    def add(self, event: TokenEvent) -> None:
        self._flush_prompt()
        for lp in event.logprobs:
            text = self._text(lp)
            self._entries.append((text, lp.logprob, _top(lp), self._offset))
            self._offset += len(text)

    def whole(self) -> dict[str, object]:
        self._flush_prompt()
        return _shape(self._entries)

    def take(self) -> dict[str, object] | None:
        """The entries since the last take (a streamed chunk's), None if none."""
        self._flush_prompt()
        new = self._entries[self._num_taken:]
        self._num_taken = len(self._entries)
        return _shape(new) if new else None

    def _flush_prompt(self) -> None:
        if self._prompt_done:
            return
        self._prompt_done = True
        texts = [self._text(lp) for lp in self._prompt]
        offset = max(0, len(self._echoed_prompt) - sum(map(len, texts)))
        for lp, text in zip(self._prompt, texts, strict=True):
            self._entries.append((text, lp.logprob, _top(lp), offset))
            offset += len(text)

    def _text(self, lp: TokenLogprob) -> str:
        return next((text for token_id, text, _ in lp.top if token_id == lp.token_id), None) or self._piece_of(lp.token_id)


def _top(lp: TokenLogprob) -> dict[str, float]:
    return {text: logprob for _, text, logprob in lp.top}


def _shape(entries: list[Entry]) -> dict[str, object]:
    return {
        "tokens": [e[0] for e in entries],
        "token_logprobs": [e[1] for e in entries],
        "top_logprobs": [e[2] for e in entries],
        "text_offset": [e[3] for e in entries],
    }
