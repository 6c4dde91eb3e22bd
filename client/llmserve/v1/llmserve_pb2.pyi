from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_STOP_SEQUENCE: _ClassVar[FinishReason]
    FINISH_REASON_CANCELLED: _ClassVar[FinishReason]
    FINISH_REASON_DEADLINE: _ClassVar[FinishReason]
    FINISH_REASON_CONTEXT_FULL: _ClassVar[FinishReason]
    FINISH_REASON_ERROR: _ClassVar[FinishReason]
    FINISH_REASON_TOOL_CALLS: _ClassVar[FinishReason]
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_STOP_SEQUENCE: FinishReason
FINISH_REASON_CANCELLED: FinishReason
FINISH_REASON_DEADLINE: FinishReason
FINISH_REASON_CONTEXT_FULL: FinishReason
FINISH_REASON_ERROR: FinishReason
FINISH_REASON_TOOL_CALLS: FinishReason

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_k", "top_p", "min_p", "seed", "repeat_penalty", "presence_penalty", "frequency_penalty", "repeat_last_n", "dynatemp_range", "dynatemp_exponent", "typical_p", "top_n_sigma", "xtc_probability", "xtc_threshold", "dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n", "dry_sequence_breakers", "mirostat", "mirostat_tau", "mirostat_eta", "logit_bias", "deterministic")
    class LogitBiasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    REPEAT_PENALTY_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    REPEAT_LAST_N_FIELD_NUMBER: _ClassVar[int]
    DYNATEMP_RANGE_FIELD_NUMBER: _ClassVar[int]
    DYNATEMP_EXPONENT_FIELD_NUMBER: _ClassVar[int]
    TYPICAL_P_FIELD_NUMBER: _ClassVar[int]
    TOP_N_SIGMA_FIELD_NUMBER: _ClassVar[int]
    XTC_PROBABILITY_FIELD_NUMBER: _ClassVar[int]
    XTC_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    DRY_MULTIPLIER_FIELD_NUMBER: _ClassVar[int]
    DRY_BASE_FIELD_NUMBER: _ClassVar[int]
    DRY_ALLOWED_LENGTH_FIELD_NUMBER: _ClassVar[int]
    DRY_PENALTY_LAST_N_FIELD_NUMBER: _ClassVar[int]
    DRY_SEQUENCE_BREAKERS_FIELD_NUMBER: _ClassVar[int]
    MIROSTAT_FIELD_NUMBER: _ClassVar[int]
    MIROSTAT_TAU_FIELD_NUMBER: _ClassVar[int]
    MIROSTAT_ETA_FIELD_NUMBER: _ClassVar[int]
    LOGIT_BIAS_FIELD_NUMBER: _ClassVar[int]
    DETERMINISTIC_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    seed: int
    repeat_penalty: float
    presence_penalty: float
    frequency_penalty: float
    repeat_last_n: int
    dynatemp_range: float
    dynatemp_exponent: float
    typical_p: float
    top_n_sigma: float
    xtc_probability: float
    xtc_threshold: float
    dry_multiplier: float
    dry_base: float
    dry_allowed_length: int
    dry_penalty_last_n: int
    dry_sequence_breakers: StringList
    mirostat: int
    mirostat_tau: float
    mirostat_eta: float
    logit_bias: _containers.ScalarMap[int, float]
    deterministic: bool
    def __init__(self, temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., min_p: _Optional[float] = ..., seed: _Optional[int] = ..., repeat_penalty: _Optional[float] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., repeat_last_n: _Optional[int] = ..., dynatemp_range: _Optional[float] = ..., dynatemp_exponent: _Optional[float] = ..., typical_p: _Optional[float] = ..., top_n_sigma: _Optional[float] = ..., xtc_probability: _Optional[float] = ..., xtc_threshold: _Optional[float] = ..., dry_multiplier: _Optional[float] = ..., dry_base: _Optional[float] = ..., dry_allowed_length: _Optional[int] = ..., dry_penalty_last_n: _Optional[int] = ..., dry_sequence_breakers: _Optional[_Union[StringList, _Mapping]] = ..., mirostat: _Optional[int] = ..., mirostat_tau: _Optional[float] = ..., mirostat_eta: _Optional[float] = ..., logit_bias: _Optional[_Mapping[int, float]] = ..., deterministic: _Optional[bool] = ...) -> None: ...

class StringList(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, values: _Optional[_Iterable[str]] = ...) -> None: ...

class StoppingCriteria(_message.Message):
    __slots__ = ("max_tokens", "stop", "ignore_eos", "min_tokens", "stop_token_ids")
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    MIN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    max_tokens: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    ignore_eos: bool
    min_tokens: int
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, max_tokens: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., ignore_eos: _Optional[bool] = ..., min_tokens: _Optional[int] = ..., stop_token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class OutputOptions(_message.Message):
    __slots__ = ("top_logprobs", "prompt_logprobs", "include_special")
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_SPECIAL_FIELD_NUMBER: _ClassVar[int]
    top_logprobs: int
    prompt_logprobs: bool
    include_special: bool
    def __init__(self, top_logprobs: _Optional[int] = ..., prompt_logprobs: _Optional[bool] = ..., include_special: _Optional[bool] = ...) -> None: ...

class Constraint(_message.Message):
    __slots__ = ("grammar", "json_schema", "regex", "choice", "json_object", "strict")
    GRAMMAR_FIELD_NUMBER: _ClassVar[int]
    JSON_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    REGEX_FIELD_NUMBER: _ClassVar[int]
    CHOICE_FIELD_NUMBER: _ClassVar[int]
    JSON_OBJECT_FIELD_NUMBER: _ClassVar[int]
    STRICT_FIELD_NUMBER: _ClassVar[int]
    grammar: str
    json_schema: str
    regex: str
    choice: StringList
    json_object: bool
    strict: bool
    def __init__(self, grammar: _Optional[str] = ..., json_schema: _Optional[str] = ..., regex: _Optional[str] = ..., choice: _Optional[_Union[StringList, _Mapping]] = ..., json_object: _Optional[bool] = ..., strict: _Optional[bool] = ...) -> None: ...

class Tool(_message.Message):
    __slots__ = ("name", "description", "parameters", "strict")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    STRICT_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    parameters: str
    strict: bool
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., parameters: _Optional[str] = ..., strict: _Optional[bool] = ...) -> None: ...

class ToolChoice(_message.Message):
    __slots__ = ("mode", "function_name")
    class Mode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        MODE_UNSPECIFIED: _ClassVar[ToolChoice.Mode]
        MODE_NONE: _ClassVar[ToolChoice.Mode]
        MODE_AUTO: _ClassVar[ToolChoice.Mode]
        MODE_REQUIRED: _ClassVar[ToolChoice.Mode]
        MODE_FUNCTION: _ClassVar[ToolChoice.Mode]
    MODE_UNSPECIFIED: ToolChoice.Mode
    MODE_NONE: ToolChoice.Mode
    MODE_AUTO: ToolChoice.Mode
    MODE_REQUIRED: ToolChoice.Mode
    MODE_FUNCTION: ToolChoice.Mode
    MODE_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_NAME_FIELD_NUMBER: _ClassVar[int]
    mode: ToolChoice.Mode
    function_name: str
    def __init__(self, mode: _Optional[_Union[ToolChoice.Mode, str]] = ..., function_name: _Optional[str] = ...) -> None: ...

class ToolCall(_message.Message):
    __slots__ = ("id", "name", "arguments")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    arguments: str
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., arguments: _Optional[str] = ...) -> None: ...

class ToolCallDelta(_message.Message):
    __slots__ = ("index", "id", "name", "arguments")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
    index: int
    id: str
    name: str
    arguments: str
    def __init__(self, index: _Optional[int] = ..., id: _Optional[str] = ..., name: _Optional[str] = ..., arguments: _Optional[str] = ...) -> None: ...

class SessionConfig(_message.Message):
    __slots__ = ("request_id", "sampling", "stopping", "add_bos", "priority", "output", "constraint", "n", "session_id", "tools", "tool_choice", "parallel_tool_calls", "adapter", "continue_from", "store", "model")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    STOPPING_FIELD_NUMBER: _ClassVar[int]
    ADD_BOS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINT_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CHOICE_FIELD_NUMBER: _ClassVar[int]
    PARALLEL_TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    CONTINUE_FROM_FIELD_NUMBER: _ClassVar[int]
    STORE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    sampling: SamplingParams
    stopping: StoppingCriteria
    add_bos: bool
    priority: int
    output: OutputOptions
    constraint: Constraint
    n: int
    session_id: str
    tools: _containers.RepeatedCompositeFieldContainer[Tool]
    tool_choice: ToolChoice
    parallel_tool_calls: bool
    adapter: AdapterRef
    continue_from: str
    store: bool
    model: str
    def __init__(self, request_id: _Optional[str] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., stopping: _Optional[_Union[StoppingCriteria, _Mapping]] = ..., add_bos: _Optional[bool] = ..., priority: _Optional[int] = ..., output: _Optional[_Union[OutputOptions, _Mapping]] = ..., constraint: _Optional[_Union[Constraint, _Mapping]] = ..., n: _Optional[int] = ..., session_id: _Optional[str] = ..., tools: _Optional[_Iterable[_Union[Tool, _Mapping]]] = ..., tool_choice: _Optional[_Union[ToolChoice, _Mapping]] = ..., parallel_tool_calls: _Optional[bool] = ..., adapter: _Optional[_Union[AdapterRef, _Mapping]] = ..., continue_from: _Optional[str] = ..., store: _Optional[bool] = ..., model: _Optional[str] = ...) -> None: ...

class AdapterRef(_message.Message):
    __slots__ = ("name", "scale")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SCALE_FIELD_NUMBER: _ClassVar[int]
    name: str
    scale: float
    def __init__(self, name: _Optional[str] = ..., scale: _Optional[float] = ...) -> None: ...

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class ChatMessage(_message.Message):
    __slots__ = ("role", "content", "tool_calls", "tool_call_id")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    tool_call_id: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ..., tool_call_id: _Optional[str] = ...) -> None: ...

class ChatMessages(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ...) -> None: ...

class Input(_message.Message):
    __slots__ = ("text", "tokens", "messages")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    text: str
    tokens: TokenIds
    messages: ChatMessages
    def __init__(self, text: _Optional[str] = ..., tokens: _Optional[_Union[TokenIds, _Mapping]] = ..., messages: _Optional[_Union[ChatMessages, _Mapping]] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("config", "input", "end_of_turn", "cancel")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    END_OF_TURN_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    config: SessionConfig
    input: Input
    end_of_turn: bool
    cancel: bool
    def __init__(self, config: _Optional[_Union[SessionConfig, _Mapping]] = ..., input: _Optional[_Union[Input, _Mapping]] = ..., end_of_turn: _Optional[bool] = ..., cancel: _Optional[bool] = ...) -> None: ...

class TopLogprob(_message.Message):
    __slots__ = ("token_id", "text", "logprob")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    text: str
    logprob: float
    def __init__(self, token_id: _Optional[int] = ..., text: _Optional[str] = ..., logprob: _Optional[float] = ...) -> None: ...

class TokenLogprob(_message.Message):
    __slots__ = ("token_id", "logprob", "top")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    logprob: float
    top: _containers.RepeatedCompositeFieldContainer[TopLogprob]
    def __init__(self, token_id: _Optional[int] = ..., logprob: _Optional[float] = ..., top: _Optional[_Iterable[_Union[TopLogprob, _Mapping]]] = ...) -> None: ...

class TokenChunk(_message.Message):
    __slots__ = ("text", "token_ids", "logprobs", "index", "tool_calls")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    index: int
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCallDelta]
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ..., index: _Optional[int] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCallDelta, _Mapping]]] = ...) -> None: ...

class PromptLogprobs(_message.Message):
    __slots__ = ("tokens",)
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    def __init__(self, tokens: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "cached_tokens", "completion_tokens", "draft_tokens", "accepted_draft_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    draft_tokens: int
    accepted_draft_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., draft_tokens: _Optional[int] = ..., accepted_draft_tokens: _Optional[int] = ...) -> None: ...

class Timings(_message.Message):
    __slots__ = ("queue_ms", "time_to_first_token_ms", "prompt_ms", "decode_ms", "decode_tokens_per_second")
    QUEUE_MS_FIELD_NUMBER: _ClassVar[int]
    TIME_TO_FIRST_TOKEN_MS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_MS_FIELD_NUMBER: _ClassVar[int]
    DECODE_MS_FIELD_NUMBER: _ClassVar[int]
    DECODE_TOKENS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    queue_ms: float
    time_to_first_token_ms: float
    prompt_ms: float
    decode_ms: float
    decode_tokens_per_second: float
    def __init__(self, queue_ms: _Optional[float] = ..., time_to_first_token_ms: _Optional[float] = ..., prompt_ms: _Optional[float] = ..., decode_ms: _Optional[float] = ..., decode_tokens_per_second: _Optional[float] = ...) -> None: ...

class TurnEnd(_message.Message):
    __slots__ = ("finish_reason", "matched_stop", "usage", "timings", "seed", "message", "index", "matched_stop_token_id", "tool_calls", "stored_id")
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    MATCHED_STOP_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    MATCHED_STOP_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    STORED_ID_FIELD_NUMBER: _ClassVar[int]
    finish_reason: FinishReason
    matched_stop: str
    usage: Usage
    timings: Timings
    seed: int
    message: str
    index: int
    matched_stop_token_id: int
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    stored_id: str
    def __init__(self, finish_reason: _Optional[_Union[FinishReason, str]] = ..., matched_stop: _Optional[str] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ..., seed: _Optional[int] = ..., message: _Optional[str] = ..., index: _Optional[int] = ..., matched_stop_token_id: _Optional[int] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ..., stored_id: _Optional[str] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("request_id", "chunk", "turn_end", "prompt_logprobs")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    TURN_END_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    chunk: TokenChunk
    turn_end: TurnEnd
    prompt_logprobs: PromptLogprobs
    def __init__(self, request_id: _Optional[str] = ..., chunk: _Optional[_Union[TokenChunk, _Mapping]] = ..., turn_end: _Optional[_Union[TurnEnd, _Mapping]] = ..., prompt_logprobs: _Optional[_Union[PromptLogprobs, _Mapping]] = ...) -> None: ...

class GenerateOnceRequest(_message.Message):
    __slots__ = ("config", "input")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    config: SessionConfig
    input: Input
    def __init__(self, config: _Optional[_Union[SessionConfig, _Mapping]] = ..., input: _Optional[_Union[Input, _Mapping]] = ...) -> None: ...

class GenerateOnceResponse(_message.Message):
    __slots__ = ("request_id", "chunk", "turn_end", "prompt_logprobs")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    TURN_END_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    chunk: TokenChunk
    turn_end: TurnEnd
    prompt_logprobs: PromptLogprobs
    def __init__(self, request_id: _Optional[str] = ..., chunk: _Optional[_Union[TokenChunk, _Mapping]] = ..., turn_end: _Optional[_Union[TurnEnd, _Mapping]] = ..., prompt_logprobs: _Optional[_Union[PromptLogprobs, _Mapping]] = ...) -> None: ...

class GenerateTextRequest(_message.Message):
    __slots__ = ("config", "input")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    config: SessionConfig
    input: Input
    def __init__(self, config: _Optional[_Union[SessionConfig, _Mapping]] = ..., input: _Optional[_Union[Input, _Mapping]] = ...) -> None: ...

class GenerateTextResponse(_message.Message):
    __slots__ = ("request_id", "samples", "prompt_logprobs")
    class Sample(_message.Message):
        __slots__ = ("index", "text", "token_ids", "logprobs", "turn_end")
        INDEX_FIELD_NUMBER: _ClassVar[int]
        TEXT_FIELD_NUMBER: _ClassVar[int]
        TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
        LOGPROBS_FIELD_NUMBER: _ClassVar[int]
        TURN_END_FIELD_NUMBER: _ClassVar[int]
        index: int
        text: str
        token_ids: _containers.RepeatedScalarFieldContainer[int]
        logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
        turn_end: TurnEnd
        def __init__(self, index: _Optional[int] = ..., text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ..., turn_end: _Optional[_Union[TurnEnd, _Mapping]] = ...) -> None: ...
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    samples: _containers.RepeatedCompositeFieldContainer[GenerateTextResponse.Sample]
    prompt_logprobs: PromptLogprobs
    def __init__(self, request_id: _Optional[str] = ..., samples: _Optional[_Iterable[_Union[GenerateTextResponse.Sample, _Mapping]]] = ..., prompt_logprobs: _Optional[_Union[PromptLogprobs, _Mapping]] = ...) -> None: ...

class EmbedOptions(_message.Message):
    __slots__ = ("normalize", "truncate", "add_bos")
    NORMALIZE_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_FIELD_NUMBER: _ClassVar[int]
    ADD_BOS_FIELD_NUMBER: _ClassVar[int]
    normalize: bool
    truncate: bool
    add_bos: bool
    def __init__(self, normalize: _Optional[bool] = ..., truncate: _Optional[bool] = ..., add_bos: _Optional[bool] = ...) -> None: ...

class EmbedRequest(_message.Message):
    __slots__ = ("options", "inputs", "model")
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    options: EmbedOptions
    inputs: _containers.RepeatedCompositeFieldContainer[Input]
    model: str
    def __init__(self, options: _Optional[_Union[EmbedOptions, _Mapping]] = ..., inputs: _Optional[_Iterable[_Union[Input, _Mapping]]] = ..., model: _Optional[str] = ...) -> None: ...

class EmbedResponse(_message.Message):
    __slots__ = ("index", "embedding", "num_tokens", "truncated")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    index: int
    embedding: _containers.RepeatedScalarFieldContainer[float]
    num_tokens: int
    truncated: bool
    def __init__(self, index: _Optional[int] = ..., embedding: _Optional[_Iterable[float]] = ..., num_tokens: _Optional[int] = ..., truncated: _Optional[bool] = ...) -> None: ...

class TokenizeRequest(_message.Message):
    __slots__ = ("text", "add_special", "parse_special", "with_pieces", "embedding_model", "model")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    ADD_SPECIAL_FIELD_NUMBER: _ClassVar[int]
    PARSE_SPECIAL_FIELD_NUMBER: _ClassVar[int]
    WITH_PIECES_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_MODEL_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    text: str
    add_special: bool
    parse_special: bool
    with_pieces: bool
    embedding_model: bool
    model: str
    def __init__(self, text: _Optional[str] = ..., add_special: _Optional[bool] = ..., parse_special: _Optional[bool] = ..., with_pieces: _Optional[bool] = ..., embedding_model: _Optional[bool] = ..., model: _Optional[str] = ...) -> None: ...

class TokenizeResponse(_message.Message):
    __slots__ = ("ids", "pieces")
    IDS_FIELD_NUMBER: _ClassVar[int]
    PIECES_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    pieces: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, ids: _Optional[_Iterable[int]] = ..., pieces: _Optional[_Iterable[bytes]] = ...) -> None: ...

class DetokenizeRequest(_message.Message):
    __slots__ = ("ids", "render_special", "embedding_model", "model")
    IDS_FIELD_NUMBER: _ClassVar[int]
    RENDER_SPECIAL_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_MODEL_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    render_special: bool
    embedding_model: bool
    model: str
    def __init__(self, ids: _Optional[_Iterable[int]] = ..., render_special: _Optional[bool] = ..., embedding_model: _Optional[bool] = ..., model: _Optional[str] = ...) -> None: ...

class DetokenizeResponse(_message.Message):
    __slots__ = ("text",)
    TEXT_FIELD_NUMBER: _ClassVar[int]
    text: str
    def __init__(self, text: _Optional[str] = ...) -> None: ...

class GetModelInfoRequest(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: str
    def __init__(self, model: _Optional[str] = ...) -> None: ...

class SlotInfo(_message.Message):
    __slots__ = ("seq_id", "busy", "num_cached_tokens", "paused", "kv_pos_min", "kv_pos_max")
    SEQ_ID_FIELD_NUMBER: _ClassVar[int]
    BUSY_FIELD_NUMBER: _ClassVar[int]
    NUM_CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    KV_POS_MIN_FIELD_NUMBER: _ClassVar[int]
    KV_POS_MAX_FIELD_NUMBER: _ClassVar[int]
    seq_id: int
    busy: bool
    num_cached_tokens: int
    paused: bool
    kv_pos_min: int
    kv_pos_max: int
    def __init__(self, seq_id: _Optional[int] = ..., busy: _Optional[bool] = ..., num_cached_tokens: _Optional[int] = ..., paused: _Optional[bool] = ..., kv_pos_min: _Optional[int] = ..., kv_pos_max: _Optional[int] = ...) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("name", "path", "architecture", "num_parameters", "n_ctx_train", "n_ctx", "n_ctx_per_slot", "n_embd", "vocab_size", "bos_token_id", "eos_token_id", "eog_token_ids", "has_chat_template", "can_generate", "can_embed", "n_parallel", "n_batch", "n_ubatch", "pooling_type", "version", "slots", "num_sessions_waiting", "max_queue", "features", "embedding_model", "n_swa", "adapters", "models")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    NUM_PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    N_CTX_TRAIN_FIELD_NUMBER: _ClassVar[int]
    N_CTX_FIELD_NUMBER: _ClassVar[int]
    N_CTX_PER_SLOT_FIELD_NUMBER: _ClassVar[int]
    N_EMBD_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    BOS_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    EOG_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    HAS_CHAT_TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    CAN_GENERATE_FIELD_NUMBER: _ClassVar[int]
    CAN_EMBED_FIELD_NUMBER: _ClassVar[int]
    N_PARALLEL_FIELD_NUMBER: _ClassVar[int]
    N_BATCH_FIELD_NUMBER: _ClassVar[int]
    N_UBATCH_FIELD_NUMBER: _ClassVar[int]
    POOLING_TYPE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    NUM_SESSIONS_WAITING_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUE_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_MODEL_FIELD_NUMBER: _ClassVar[int]
    N_SWA_FIELD_NUMBER: _ClassVar[int]
    ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    name: str
    path: str
    architecture: str
    num_parameters: int
    n_ctx_train: int
    n_ctx: int
    n_ctx_per_slot: int
    n_embd: int
    vocab_size: int
    bos_token_id: int
    eos_token_id: int
    eog_token_ids: _containers.RepeatedScalarFieldContainer[int]
    has_chat_template: bool
    can_generate: bool
    can_embed: bool
    n_parallel: int
    n_batch: int
    n_ubatch: int
    pooling_type: str
    version: str
    slots: _containers.RepeatedCompositeFieldContainer[SlotInfo]
    num_sessions_waiting: int
    max_queue: int
    features: Features
    embedding_model: EmbeddingModelInfo
    n_swa: int
    adapters: _containers.RepeatedCompositeFieldContainer[AdapterInfo]
    models: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., path: _Optional[str] = ..., architecture: _Optional[str] = ..., num_parameters: _Optional[int] = ..., n_ctx_train: _Optional[int] = ..., n_ctx: _Optional[int] = ..., n_ctx_per_slot: _Optional[int] = ..., n_embd: _Optional[int] = ..., vocab_size: _Optional[int] = ..., bos_token_id: _Optional[int] = ..., eos_token_id: _Optional[int] = ..., eog_token_ids: _Optional[_Iterable[int]] = ..., has_chat_template: _Optional[bool] = ..., can_generate: _Optional[bool] = ..., can_embed: _Optional[bool] = ..., n_parallel: _Optional[int] = ..., n_batch: _Optional[int] = ..., n_ubatch: _Optional[int] = ..., pooling_type: _Optional[str] = ..., version: _Optional[str] = ..., slots: _Optional[_Iterable[_Union[SlotInfo, _Mapping]]] = ..., num_sessions_waiting: _Optional[int] = ..., max_queue: _Optional[int] = ..., features: _Optional[_Union[Features, _Mapping]] = ..., embedding_model: _Optional[_Union[EmbeddingModelInfo, _Mapping]] = ..., n_swa: _Optional[int] = ..., adapters: _Optional[_Iterable[_Union[AdapterInfo, _Mapping]]] = ..., models: _Optional[_Iterable[str]] = ...) -> None: ...

class AdapterInfo(_message.Message):
    __slots__ = ("name", "path", "scale", "id", "rank", "size_bytes", "state", "num_sessions")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    SCALE_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    NUM_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    path: str
    scale: float
    id: int
    rank: int
    size_bytes: int
    state: str
    num_sessions: int
    def __init__(self, name: _Optional[str] = ..., path: _Optional[str] = ..., scale: _Optional[float] = ..., id: _Optional[int] = ..., rank: _Optional[int] = ..., size_bytes: _Optional[int] = ..., state: _Optional[str] = ..., num_sessions: _Optional[int] = ...) -> None: ...

class LoadAdapterRequest(_message.Message):
    __slots__ = ("name", "path", "scale")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    SCALE_FIELD_NUMBER: _ClassVar[int]
    name: str
    path: str
    scale: float
    def __init__(self, name: _Optional[str] = ..., path: _Optional[str] = ..., scale: _Optional[float] = ...) -> None: ...

class UnloadAdapterRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class UnloadAdapterResponse(_message.Message):
    __slots__ = ("freed",)
    FREED_FIELD_NUMBER: _ClassVar[int]
    freed: bool
    def __init__(self, freed: _Optional[bool] = ...) -> None: ...

class ListAdaptersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListAdaptersResponse(_message.Message):
    __slots__ = ("adapters", "max_loras")
    ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    MAX_LORAS_FIELD_NUMBER: _ClassVar[int]
    adapters: _containers.RepeatedCompositeFieldContainer[AdapterInfo]
    max_loras: int
    def __init__(self, adapters: _Optional[_Iterable[_Union[AdapterInfo, _Mapping]]] = ..., max_loras: _Optional[int] = ...) -> None: ...

class EmbeddingModelInfo(_message.Message):
    __slots__ = ("name", "path", "architecture", "num_parameters", "n_ctx_train", "n_embd", "vocab_size", "pooling_type", "max_input_tokens", "n_ubatch", "separate")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    NUM_PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    N_CTX_TRAIN_FIELD_NUMBER: _ClassVar[int]
    N_EMBD_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    POOLING_TYPE_FIELD_NUMBER: _ClassVar[int]
    MAX_INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    N_UBATCH_FIELD_NUMBER: _ClassVar[int]
    SEPARATE_FIELD_NUMBER: _ClassVar[int]
    name: str
    path: str
    architecture: str
    num_parameters: int
    n_ctx_train: int
    n_embd: int
    vocab_size: int
    pooling_type: str
    max_input_tokens: int
    n_ubatch: int
    separate: bool
    def __init__(self, name: _Optional[str] = ..., path: _Optional[str] = ..., architecture: _Optional[str] = ..., num_parameters: _Optional[int] = ..., n_ctx_train: _Optional[int] = ..., n_embd: _Optional[int] = ..., vocab_size: _Optional[int] = ..., pooling_type: _Optional[str] = ..., max_input_tokens: _Optional[int] = ..., n_ubatch: _Optional[int] = ..., separate: _Optional[bool] = ...) -> None: ...

class Features(_message.Message):
    __slots__ = ("samplers", "max_top_logprobs", "prompt_logprobs", "grammar", "json_schema", "chat", "chat_template_source", "max_samples", "regex", "choice", "json_object", "tools", "strict")
    SAMPLERS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_FIELD_NUMBER: _ClassVar[int]
    JSON_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    CHAT_FIELD_NUMBER: _ClassVar[int]
    CHAT_TEMPLATE_SOURCE_FIELD_NUMBER: _ClassVar[int]
    MAX_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    REGEX_FIELD_NUMBER: _ClassVar[int]
    CHOICE_FIELD_NUMBER: _ClassVar[int]
    JSON_OBJECT_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    STRICT_FIELD_NUMBER: _ClassVar[int]
    samplers: _containers.RepeatedScalarFieldContainer[str]
    max_top_logprobs: int
    prompt_logprobs: bool
    grammar: bool
    json_schema: bool
    chat: bool
    chat_template_source: str
    max_samples: int
    regex: bool
    choice: bool
    json_object: bool
    tools: bool
    strict: bool
    def __init__(self, samplers: _Optional[_Iterable[str]] = ..., max_top_logprobs: _Optional[int] = ..., prompt_logprobs: _Optional[bool] = ..., grammar: _Optional[bool] = ..., json_schema: _Optional[bool] = ..., chat: _Optional[bool] = ..., chat_template_source: _Optional[str] = ..., max_samples: _Optional[int] = ..., regex: _Optional[bool] = ..., choice: _Optional[bool] = ..., json_object: _Optional[bool] = ..., tools: _Optional[bool] = ..., strict: _Optional[bool] = ...) -> None: ...
