/**
 * @llmserve/client: a TypeScript client for llmserve (local GGUF LLMs over gRPC).
 *
 * `Client` wraps the generated LLMService stubs: `generate` / `generateText` /
 * `stream` / `streamOnce` (one turn), `session()` (multi-turn, `send` / `ask` /
 * `cancel` / `close`), `embed` (backpressure), `tokenize`, `detokenize`, `modelInfo`.
 * Failed calls throw `LLMServeError` subclasses with the BadRequest field violations
 * and the retry hint. The generated messages are exported as `pb`.
 *
 * @packageDocumentation
 */
export { HEAD_CHARS, HEAD_TOKENS, prefixAffinityKey } from "./affinity.js";
export { Client, type CallOptions, type GenerateOptions } from "./client.js";
export { AFFINITY_HEADER, headersInterceptor, openTransport, type ClientOptions, type TlsOptions } from "./connection.js";
export { type Embedding, type EmbedCallOptions, type EmbedProgress } from "./embed.js";
export * from "./errors.js";
export {
  embedRequest,
  makeInput,
  samplingParams,
  sessionConfig,
  type ChatMessageInit,
  type EmbedOptionsInit,
  type GenerateConfig,
  type Prompt,
  type SamplingOptions,
} from "./requests.js";
export { collect, type GenerateResult, type TurnResponse } from "./results.js";
export { parseGrpcTimeout, retryInterceptor, type RetryPolicy } from "./retry.js";
export { CANCEL_GRACE_MS, Session, type SessionCallOptions, type TurnOptions } from "./session.js";
export * as pb from "./gen/llmserve/v1/llmserve_pb.js";
export { Code, ConnectError } from "@connectrpc/connect";
