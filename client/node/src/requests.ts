/**
 * Building request messages: inputs (text, token ids, chat messages) and session
 * configs from flat options, as the Python SDK's `make_input` / `session_config`.
 *
 * @module
 */
import { create, isMessage, type MessageInitShape } from "@bufbuild/protobuf";
import {
  AdapterRefSchema,
  ConstraintSchema,
  EmbedRequestSchema,
  InputSchema,
  OutputOptionsSchema,
  SamplingParamsSchema,
  SessionConfigSchema,
  StoppingCriteriaSchema,
  StringListSchema,
  ToolChoice_Mode,
  ToolChoiceSchema,
  ToolSchema,
  type EmbedRequest,
  type Input,
  type SamplingParams,
  type SessionConfig,
} from "./gen/llmserve/v1/llmserve_pb.js";

/** A chat message: rendered with the model's chat template. */
export interface ChatMessageInit {
  role: string;
  content: string;
}

/** What a turn or an embedding input can be: text, token ids, chat messages, or an Input. */
export type Prompt = string | readonly number[] | readonly ChatMessageInit[] | Input;

/** The SamplingParams fields, by their TypeScript names (temperature, topK, seed, ...). */
export type SamplingOptions = Omit<MessageInitShape<typeof SamplingParamsSchema>, "$typeName" | "drySequenceBreakers"> & {
  /** DRY's sequence breakers (default ["\n", ":", "\"", "*"]). */
  drySequenceBreakers?: string[];
};

/**
 * A session's configuration as flat options (every SessionConfig field has one);
 * undefined leaves a field unset, i.e. the server's default.
 *
 * Session: `requestId`, `sessionId`, `priority`, `addBos`, `n` (samples per turn).
 * Stopping: `maxTokens`, `minTokens`, `stop`, `stopTokenIds`, `ignoreEos`.
 * Output: `logprobs` (each sampled token's logprob), `topLogprobs`, `promptLogprobs`,
 * `includeSpecial`. Constraint (one at most): `grammar` (GBNF), `jsonSchema` (string or
 * object), `regex`, `choice` (strings) or `jsonObject: true`; `strict` refuses a jsonSchema
 * keyword the server would not enforce.
 * Tools: `tools` (`{name, description?, parameters?}`, parameters a JSON Schema object or
 * text), `toolChoice` ("none", "auto", "required" or a tool's name), `parallelToolCalls`;
 * calls come back in `TurnEnd.toolCalls`.
 * LoRA: `adapter` (a loaded adapter's name) and `adapterScale` (unset: the adapter's own).
 * `continueFrom`: a stored conversation's id (a response stored by POST /v1/responses) that
 * the first turn's messages continue; `store: true` keeps each chat turn's conversation, its
 * id in `TurnEnd.storedId`, for `continueFrom` (or HTTP's previous_response_id) later.
 * `model`: which model serves the session, by name (ModelInfo.models; unset: the default).
 * Sampling: every SamplingParams field (`temperature`, `topK`, `seed`, `logitBias`, ...).
 * `config`: a SessionConfig init merged under the flat options.
 */
export type GenerateConfig = SamplingOptions & {
  requestId?: string;
  sessionId?: string;
  priority?: number;
  addBos?: boolean;
  n?: number;
  maxTokens?: number;
  minTokens?: number;
  stop?: string[];
  stopTokenIds?: number[];
  ignoreEos?: boolean;
  logprobs?: boolean;
  topLogprobs?: number;
  promptLogprobs?: boolean;
  includeSpecial?: boolean;
  grammar?: string;
  jsonSchema?: string | Record<string, unknown>;
  regex?: string;
  choice?: string[];
  jsonObject?: boolean;
  strict?: boolean;
  tools?: ToolInit[];
  toolChoice?: string;
  parallelToolCalls?: boolean;
  adapter?: string;
  adapterScale?: number;
  continueFrom?: string;
  store?: boolean;
  model?: string;
  config?: MessageInitShape<typeof SessionConfigSchema>;
};

/** A function the model may call: `parameters` is its arguments' JSON Schema. */
export interface ToolInit {
  name: string;
  description?: string;
  parameters?: string | Record<string, unknown>;
}

const TOOL_MODES: Record<string, ToolChoice_Mode> = {
  none: ToolChoice_Mode.NONE, auto: ToolChoice_Mode.AUTO, required: ToolChoice_Mode.REQUIRED,
};

const SESSION_KEYS = new Set([
  "requestId", "sessionId", "priority", "addBos", "n", "maxTokens", "minTokens", "stop", "stopTokenIds",
  "ignoreEos", "logprobs", "topLogprobs", "promptLogprobs", "includeSpecial", "grammar", "jsonSchema", "regex", "choice",
  "jsonObject", "strict", "tools", "toolChoice", "parallelToolCalls", "adapter", "adapterScale", "continueFrom", "store", "model",
  "config",
]);
/** Keys of call options that may ride along in the same object; not config. */
const CALL_KEYS = new Set(["timeoutMs", "signal", "headers"]);
const SAMPLING_KEYS = new Set(SamplingParamsSchema.fields.map((f) => f.localName));

/** An Input from text, token ids, or chat messages (`[{role, content}, ...]`). */
export function makeInput(prompt: Prompt): Input {
  if (isMessage(prompt, InputSchema)) return prompt;
  if (typeof prompt === "string") return create(InputSchema, { kind: { case: "text", value: prompt } });
  const items = prompt as readonly (number | ChatMessageInit)[];
  if (items.length > 0 && typeof items[0] === "object") {
    const messages = (items as readonly ChatMessageInit[]).map((m) => ({ role: m.role, content: m.content }));
    return create(InputSchema, { kind: { case: "messages", value: { messages } } });
  }
  return create(InputSchema, { kind: { case: "tokens", value: { ids: [...(items as readonly number[])] } } });
}

/** SamplingParams from its field names; undefined leaves a field unset. */
export function samplingParams(options: SamplingOptions, into?: SamplingParams): SamplingParams {
  const { drySequenceBreakers, ...plain } = options;
  const params = into ?? create(SamplingParamsSchema);
  for (const [key, value] of Object.entries(plain)) {
    if (value !== undefined) (params as unknown as Record<string, unknown>)[key] = value;
  }
  if (drySequenceBreakers) params.drySequenceBreakers = create(StringListSchema, { values: drySequenceBreakers });
  return params;
}

/** A SessionConfig from flat options (see {@link GenerateConfig}). Unknown keys throw. */
export function sessionConfig(options: GenerateConfig = {}): SessionConfig {
  const sampling: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(options)) {
    if (value === undefined || SESSION_KEYS.has(key) || CALL_KEYS.has(key)) continue;
    if (!SAMPLING_KEYS.has(key)) {
      throw new TypeError(`unknown option ${JSON.stringify(key)}: neither a SessionConfig nor a SamplingParams field`);
    }
    sampling[key] = value;
  }
  const o = options;
  const constraints = [o.grammar, o.jsonSchema, o.regex, o.choice, o.jsonObject || undefined];
  if (constraints.filter((c) => c !== undefined).length > 1) {
    throw new TypeError("give one of grammar, jsonSchema, regex, choice, jsonObject");
  }
  const config = create(SessionConfigSchema, o.config ?? {});
  if (o.requestId !== undefined) config.requestId = o.requestId;
  if (o.sessionId !== undefined) config.sessionId = o.sessionId;
  if (o.priority !== undefined) config.priority = o.priority;
  if (o.addBos !== undefined) config.addBos = o.addBos;
  if (o.n !== undefined) config.n = o.n;
  config.sampling = samplingParams(sampling as SamplingOptions, config.sampling);
  const stopping = (config.stopping ??= create(StoppingCriteriaSchema));
  if (o.maxTokens !== undefined) stopping.maxTokens = o.maxTokens;
  if (o.minTokens !== undefined) stopping.minTokens = o.minTokens;
  if (o.stop !== undefined) stopping.stop = [...o.stop];
  if (o.stopTokenIds !== undefined) stopping.stopTokenIds = [...o.stopTokenIds];
  if (o.ignoreEos !== undefined) stopping.ignoreEos = o.ignoreEos;
  const output = (config.output ??= create(OutputOptionsSchema));
  const top = o.topLogprobs ?? (o.logprobs ? 0 : undefined);
  if (top !== undefined) output.topLogprobs = top;
  if (o.promptLogprobs !== undefined) output.promptLogprobs = o.promptLogprobs;
  if (o.includeSpecial !== undefined) output.includeSpecial = o.includeSpecial;
  if (o.grammar !== undefined) {
    config.constraint = create(ConstraintSchema, { kind: { case: "grammar", value: o.grammar } });
  } else if (o.jsonSchema !== undefined) {
    const value = typeof o.jsonSchema === "string" ? o.jsonSchema : JSON.stringify(o.jsonSchema);
    config.constraint = create(ConstraintSchema, { kind: { case: "jsonSchema", value } });
  } else if (o.regex !== undefined) {
    config.constraint = create(ConstraintSchema, { kind: { case: "regex", value: o.regex } });
  } else if (o.choice !== undefined) {
    const value = create(StringListSchema, { values: [...o.choice] });
    config.constraint = create(ConstraintSchema, { kind: { case: "choice", value } });
  } else if (o.jsonObject) {
    config.constraint = create(ConstraintSchema, { kind: { case: "jsonObject", value: true } });
  }
  if (o.strict !== undefined) (config.constraint ??= create(ConstraintSchema)).strict = o.strict;
  if (o.tools !== undefined) {
    config.tools = o.tools.map((t) => create(ToolSchema, {
      name: t.name, description: t.description ?? "",
      parameters: typeof t.parameters === "string" ? t.parameters : t.parameters ? JSON.stringify(t.parameters) : "",
    }));
  }
  if (o.toolChoice !== undefined) {
    const mode = TOOL_MODES[o.toolChoice];
    config.toolChoice = create(ToolChoiceSchema, mode !== undefined ? { mode }
      : { mode: ToolChoice_Mode.FUNCTION, functionName: o.toolChoice });
  }
  if (o.parallelToolCalls !== undefined) config.parallelToolCalls = o.parallelToolCalls;
  if (o.adapter !== undefined) config.adapter = create(AdapterRefSchema, { name: o.adapter, scale: o.adapterScale });
  if (o.continueFrom !== undefined) config.continueFrom = o.continueFrom;
  if (o.store !== undefined) config.store = o.store;
  if (o.model !== undefined) config.model = o.model;
  return config;
}

/** Embed's options. */
export interface EmbedOptionsInit {
  /** L2-normalize (default true). */
  normalize?: boolean;
  /** Cut inputs to one ubatch instead of failing with INVALID_ARGUMENT. */
  truncate?: boolean;
  /** Add the model's special tokens to text inputs (default true). */
  addBos?: boolean;
}

/** One EmbedRequest; `options` go on the stream's first message only. */
export function embedRequest(inputs: Input[], options?: EmbedOptionsInit): EmbedRequest {
  return create(EmbedRequestSchema, { inputs, ...(options ? { options } : {}) });
}
