"""Building request messages: inputs (text, token ids, chat messages) and session configs."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Union

from llmserve.v1 import llmserve_pb2 as pb

Prompt = Union[str, Sequence[int], Sequence[Mapping[str, str]], pb.Input]


def make_input(prompt: Prompt) -> pb.Input:
    """Text, token ids, or chat messages ([{"role": ..., "content": ...}, ...])."""
    if isinstance(prompt, pb.Input):
        return prompt
    if isinstance(prompt, str):
        return pb.Input(text=prompt)
    items = list(prompt)
    if items and isinstance(items[0], Mapping):
        messages = [pb.ChatMessage(role=m["role"], content=m["content"]) for m in items]  # type: ignore[index]
        return pb.Input(messages=pb.ChatMessages(messages=messages))
    return pb.Input(tokens=pb.TokenIds(ids=list(items)))  # type: ignore[arg-type]


def session_config(
    *,
    request_id: str = "",
    session_id: str = "",
    priority: int = 0,
    add_bos: bool | None = None,
    n: int | None = None,
    max_tokens: int | None = None,
    min_tokens: int | None = None,
    stop: Sequence[str] = (),
    stop_token_ids: Sequence[int] = (),
    ignore_eos: bool = False,
    logprobs: bool = False,
    top_logprobs: int | None = None,
    prompt_logprobs: bool = False,
    include_special: bool = False,
    grammar: str | None = None,
    json_schema: str | Mapping[str, Any] | None = None,
    regex: str | None = None,
    choice: Sequence[str] | None = None,
    json_object: bool = False,
    strict: bool = False,
    tools: Sequence[Mapping[str, Any] | pb.Tool] = (),
    tool_choice: str | pb.ToolChoice | None = None,
    parallel_tool_calls: bool = False,
    adapter: str | pb.AdapterRef | None = None,
    adapter_scale: float | None = None,
    continue_from: str = "",
    store: bool = False,
    model: str = "",
    **sampling: Any,
) -> pb.SessionConfig:
    """A SessionConfig from keyword arguments; every field of the message has one.

    Session: `request_id`, `session_id`, `priority`, `add_bos`, `n` (samples per turn).
    Stopping: `max_tokens`, `min_tokens`, `stop` (strings), `stop_token_ids`, `ignore_eos`.
    Output: `logprobs=True` returns each sampled token's logprob (`top_logprobs=k`: and
    the k most likely alternatives), `prompt_logprobs`, `include_special`.
    Constraint (one at most): `grammar` (GBNF), `json_schema` (a JSON string or a dict),
    `regex` (the whole output matches it), `choice` (one of these strings) or
    `json_object=True` (any JSON object); `strict=True` refuses a json_schema keyword the
    server would not enforce.
    Tools: `tools` as dicts {"name", "description", "parameters": a JSON Schema dict or
    text} (or pb.Tool), `tool_choice` "none", "auto", "required" or a tool's name, and
    `parallel_tool_calls`; calls come back in `TurnEnd.tool_calls`.
    LoRA: `adapter` (a loaded adapter's name, or pb.AdapterRef) and `adapter_scale`
    (unset: the adapter's own). `continue_from`: a stored conversation's id (a response
    stored by POST /v1/responses) that the first turn's messages continue; `store=True` keeps
    each chat turn's conversation, its id in `TurnEnd.stored_id`, for `continue_from` (or
    HTTP's previous_response_id) later. `model`: which model serves the session, by name
    (ModelInfo.models; empty: the server's default model).
    Everything else is a SamplingParams field: temperature=0, seed=1, top_k=..., with
    `logit_bias` a {token id: bias} dict and `dry_sequence_breakers` a list of strings.
    None leaves a field unset (the server's default).
    """
    constraints = [grammar is not None, json_schema is not None, regex is not None, choice is not None, json_object]
    if sum(constraints) > 1:
        raise ValueError("give one of grammar, json_schema, regex, choice, json_object")
    if logprobs and top_logprobs is None:
        top_logprobs = 0
    config = pb.SessionConfig(
        request_id=request_id,
        session_id=session_id,
        priority=priority,
        continue_from=continue_from,
        store=store,
        model=model,
        sampling=sampling_params(**sampling),
        stopping=pb.StoppingCriteria(stop=list(stop), stop_token_ids=list(stop_token_ids), ignore_eos=ignore_eos),
        output=pb.OutputOptions(prompt_logprobs=prompt_logprobs, include_special=include_special),
    )
    for message, name, value in (
        (config, "add_bos", add_bos), (config, "n", n), (config.stopping, "max_tokens", max_tokens),
        (config.stopping, "min_tokens", min_tokens), (config.output, "top_logprobs", top_logprobs),
        (config.constraint, "grammar", grammar), (config.constraint, "regex", regex),
    ):
        if value is not None:
            setattr(message, name, value)
    if json_schema is not None:
        config.constraint.json_schema = json_schema if isinstance(json_schema, str) else json.dumps(json_schema)
    if choice is not None:
        config.constraint.choice.values.extend(choice)
    if json_object:
        config.constraint.json_object = True
    config.constraint.strict = strict
    config.tools.extend(_tool(t) for t in tools)
    if isinstance(tool_choice, pb.ToolChoice):
        config.tool_choice.CopyFrom(tool_choice)
    elif tool_choice is not None:
        mode = _TOOL_MODES.get(tool_choice)
        config.tool_choice.CopyFrom(pb.ToolChoice(mode=mode) if mode is not None else
                                    pb.ToolChoice(mode=pb.ToolChoice.MODE_FUNCTION, function_name=tool_choice))
    config.parallel_tool_calls = parallel_tool_calls
    if adapter is not None:
        config.adapter.CopyFrom(adapter if isinstance(adapter, pb.AdapterRef) else pb.AdapterRef(name=adapter))
        if adapter_scale is not None:
            config.adapter.scale = adapter_scale
    return config


_TOOL_MODES = {"none": pb.ToolChoice.MODE_NONE, "auto": pb.ToolChoice.MODE_AUTO,
               "required": pb.ToolChoice.MODE_REQUIRED}


def _tool(tool: Mapping[str, Any] | pb.Tool) -> pb.Tool:
    if isinstance(tool, pb.Tool):
        return tool
    parameters = tool.get("parameters", "")
    return pb.Tool(name=tool["name"], description=tool.get("description", ""),
                   parameters=parameters if isinstance(parameters, str) else json.dumps(parameters))


_SAMPLING_FIELDS = frozenset(pb.SamplingParams.DESCRIPTOR.fields_by_name)


def sampling_params(**fields: Any) -> pb.SamplingParams:
    """SamplingParams from its field names; None leaves a field unset."""
    unknown = sorted(set(fields) - _SAMPLING_FIELDS)
    if unknown:
        raise TypeError(f"unknown session_config argument(s) {unknown}: neither a SessionConfig nor a SamplingParams field")
    params = pb.SamplingParams()
    for name, value in fields.items():
        if value is None:
            continue
        if name == "logit_bias":
            params.logit_bias.update({int(k): float(v) for k, v in value.items()})
        elif name == "dry_sequence_breakers":
            params.dry_sequence_breakers.values.extend(value)
        else:
            setattr(params, name, value)
    return params


def embed_requests(inputs, *, normalize: bool, truncate: bool, batch_size: int, model: str = ""):  # type: ignore[no-untyped-def]
    """Lazily batch any iterable of inputs into EmbedRequests (gRPC flow control paces it);
    the first names `model` ("" the default model's embeddings)."""
    options = pb.EmbedOptions(normalize=normalize, truncate=truncate)
    chunk: list[pb.Input] = []
    first = True
    for item in inputs:
        chunk.append(make_input(item))
        if len(chunk) == batch_size:
            yield pb.EmbedRequest(options=options if first else None, inputs=chunk, model=model if first else "")
            chunk, first = [], False
    if chunk or first:
        yield pb.EmbedRequest(options=options if first else None, inputs=chunk, model=model if first else "")
