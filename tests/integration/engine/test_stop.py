"""Stop strings are never streamed, even when split across tokens."""

from __future__ import annotations

from llmserve.client import Client, pb

PROMPT = "The days of the week are Monday, Tuesday, Wednesday,"


def test_stop_string_split_across_tokens(server) -> None:  # type: ignore[no-untyped-def]
    kw = dict(max_tokens=24, temperature=0, ignore_eos=True)
    with Client(server.address, timeout=60) as client:
        reference = client.generate(PROMPT, **kw)
        pieces = [client.detokenize([t]) for t in reference.token_ids]
        # A stop string made of the end of one token's text and the start of the next.
        k = next(i for i in range(2, len(pieces) - 1) if len(pieces[i].strip()) >= 2 and len(pieces[i + 1].strip()) >= 2)
        stop = pieces[k][-2:] + pieces[k + 1][:2]
        expected = reference.text[: reference.text.index(stop)]
        streamed: list[str] = []
        end = pb.TurnEnd()
        for response in client.stream(PROMPT, stop=[stop], **kw):
            if response.HasField("chunk"):
                streamed.append(response.chunk.text)
            else:
                end = response.turn_end
    text = "".join(streamed)
    assert stop not in text
    # Like with like: the streamed call repeats the reference on the slot it left, from the
    # logits saved there, decoding alone in the same cells: the same tokens up to the stop.
    assert text == expected
    assert end.finish_reason == pb.FINISH_REASON_STOP_SEQUENCE
    assert end.matched_stop == stop
