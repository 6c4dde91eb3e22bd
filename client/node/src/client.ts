/**
 * The llmserve client: one gRPC (HTTP/2) connection to a server, the generated
 * LLMService stubs (@bufbuild/protobuf + @connectrpc/connect), and the calls of the
 * Python SDK's `Client`.
 *
 * @module
 */
import { create } from "@bufbuild/protobuf";
import { createClient, type Client as ConnectClient, type Transport } from "@connectrpc/connect";
import {
  DetokenizeRequestSchema,
  GenerateOnceRequestSchema,
  GenerateRequestSchema,
  GenerateTextRequestSchema,
  GetModelInfoRequestSchema,
  LLMService,
  TokenizeRequestSchema,
  type GenerateOnceResponse,
  type GenerateResponse,
  type GenerateTextResponse,
  type Input,
  type ModelInfo,
  type SessionConfig,
} from "./gen/llmserve/v1/llmserve_pb.js";
import { prefixAffinityKey } from "./affinity.js";
import { AFFINITY_HEADER, openTransport, type ClientOptions } from "./connection.js";
import { embedStream, type EmbedCallOptions, type Embedding } from "./embed.js";
import { toLLMServeError } from "./errors.js";
import { makeInput, sessionConfig, type GenerateConfig, type Prompt } from "./requests.js";
import { collect, type GenerateResult } from "./results.js";
import { Session, type SessionCallOptions } from "./session.js";
import { cancellable } from "./stream.js";

async function* once<T>(item: T): AsyncGenerator<T> {
  yield item;
}

/** Options of one call: its deadline, an AbortSignal, more headers. */
export interface CallOptions {
  /** The call's deadline in ms, in place of the client's default (0: none). */
  timeoutMs?: number;
  /** Cancels the call. */
  signal?: AbortSignal;
  /** More headers for this call. */
  headers?: Record<string, string>;
}

/** A turn's config (flat, see {@link GenerateConfig}) and the call's options. */
export type GenerateOptions = GenerateConfig & CallOptions;

/**
 * One connection to a server. Every failed call rejects (or throws from its iterator)
 * with an `LLMServeError` subclass; every call takes `timeoutMs`, its deadline.
 *
 * ```ts
 * const client = new Client({ address: "127.0.0.1:50051", apiKey: process.env.LLMSERVE_API_KEY });
 * const result = await client.generate("The capital of France is", { maxTokens: 8, temperature: 0 });
 * ```
 */
export class Client {
  /** The generated Connect client of llmserve.v1.LLMService, for anything not wrapped here. */
  readonly rpc: ConnectClient<typeof LLMService>;
  /** The transport the calls run on. */
  readonly transport: Transport;
  private readonly options: ClientOptions;
  private readonly fixedHeaders: Record<string, string>;
  private readonly sessions: { abort(reason?: Error): void } | undefined;

  /** `options`: address, apiKey, tls, timeoutMs (default deadline), retries, headers, ... */
  constructor(options: ClientOptions = {}) {
    this.options = options;
    const opened = options.transport ? undefined : openTransport(options);
    this.transport = options.transport ?? opened!.transport;
    this.sessions = opened?.sessions;
    // A transport of the caller's has no interceptors of ours: send the headers per call.
    this.fixedHeaders = options.transport
      ? { ...(options.apiKey ? { authorization: `Bearer ${options.apiKey}` } : {}), ...(options.headers ?? {}) }
      : {};
    this.rpc = createClient(LLMService, this.transport);
  }

  /** Per-call options and headers. A Generate call's affinity header: the caller's key, else
   * the session id, else the LoRA adapter's name (`a-<name>`: an adapter's calls prefer a
   * replica that has it loaded), else the model's (`m-<name>`, a model other than the
   * default: likewise), else (with `deriveAffinity`) a key from the input's head. */
  private call(options: CallOptions, config?: SessionConfig, generate = false, head?: Input) {
    const adapter = config?.adapter?.name ? `a-${config.adapter.name}` : "";
    const model = config?.model ? `m-${config.model}` : "";
    let affinity = generate ? this.options.affinityKey || config?.sessionId || adapter || model : "";
    if (!affinity && head && this.options.deriveAffinity) affinity = prefixAffinityKey(head);
    return {
      timeoutMs: options.timeoutMs,
      signal: options.signal,
      headers: { ...this.fixedHeaders, ...(affinity ? { [AFFINITY_HEADER]: affinity } : {}), ...(options.headers ?? {}) },
    };
  }

  /**
   * One turn over a Generate stream: yields every response (chunks, then the turn end;
   * with n > 1 each sample's, told apart by `index`).
   */
  async *stream(prompt: Prompt, options: GenerateOptions = {}): AsyncGenerator<GenerateResponse> {
    const config = sessionConfig(options);
    const request = create(GenerateRequestSchema, { config, input: makeInput(prompt), endOfTurn: true });
    yield* cancellable((signal) => this.rpc.generate(once(request), { ...this.call(options, config, true, request.input), signal }), options.signal);
  }

  /** `stream` over the server-streaming GenerateOnce RPC (no bidi stream). */
  async *streamOnce(prompt: Prompt, options: GenerateOptions = {}): AsyncGenerator<GenerateOnceResponse> {
    const config = sessionConfig(options);
    const request = create(GenerateOnceRequestSchema, { config, input: makeInput(prompt) });
    yield* cancellable((signal) => this.rpc.generateOnce(request, { ...this.call(options, config, true, request.input), signal }), options.signal);
  }

  /** One turn, collected: text, token ids, turn end (sample 0's; `samples` has every one). */
  generate(prompt: Prompt, options: GenerateOptions = {}): Promise<GenerateResult> {
    return collect(this.streamOnce(prompt, options));
  }

  /** One turn over the unary GenerateText RPC (retried like every unary call). */
  async generateText(prompt: Prompt, options: GenerateOptions = {}): Promise<GenerateTextResponse> {
    const config = sessionConfig(options);
    const request = create(GenerateTextRequestSchema, { config, input: makeInput(prompt) });
    return this.unary(() => this.rpc.generateText(request, this.call(options, config, true, request.input)));
  }

  /**
   * A multi-turn session on one Generate stream (the KV stays on the server's slot).
   * `options.timeoutMs` is the deadline of the whole stream; each turn may have its own
   * (`session.ask(prompt, { timeoutMs })`).
   */
  session(options: GenerateConfig & SessionCallOptions = {}): Session {
    const config = sessionConfig(options);
    return new Session(this.rpc, config, this.call(options, config, true));
  }

  /**
   * Embeds any number of inputs (read lazily) over one Embed stream, with
   * backpressure: batches of `batchSize`, at most `maxInFlight` inputs unanswered.
   * Yields one Embedding per input, in input order.
   */
  embed(inputs: Iterable<Prompt> | AsyncIterable<Prompt>, options: EmbedCallOptions = {}): AsyncGenerator<Embedding> {
    return embedStream(this.rpc, inputs, { ...options, ...this.call(options) });
  }

  /** All vectors of `inputs`, in order (see `embed`). */
  async embedAll(inputs: Iterable<Prompt> | AsyncIterable<Prompt>, options: EmbedCallOptions = {}): Promise<number[][]> {
    const vectors: number[][] = [];
    for await (const e of this.embed(inputs, options)) vectors.push(e.vector);
    return vectors;
  }

  /** Token ids of `text`; `embeddingModel`: with the vocabulary Embed uses. */
  async tokenize(
    text: string,
    options: CallOptions & { addSpecial?: boolean; parseSpecial?: boolean; embeddingModel?: boolean } = {},
  ): Promise<number[]> {
    const request = create(TokenizeRequestSchema, {
      text,
      addSpecial: options.addSpecial ?? true,
      parseSpecial: options.parseSpecial ?? true,
      embeddingModel: options.embeddingModel ?? false,
    });
    return (await this.unary(() => this.rpc.tokenize(request, this.call(options)))).ids;
  }

  /** The text of token ids. */
  async detokenize(
    ids: readonly number[],
    options: CallOptions & { renderSpecial?: boolean; embeddingModel?: boolean } = {},
  ): Promise<string> {
    const request = create(DetokenizeRequestSchema, {
      ids: [...ids],
      renderSpecial: options.renderSpecial ?? false,
      embeddingModel: options.embeddingModel ?? false,
    });
    return (await this.unary(() => this.rpc.detokenize(request, this.call(options)))).text;
  }

  /** The model, its context and slots, the embedding model, and the features. */
  modelInfo(options: CallOptions = {}): Promise<ModelInfo> {
    return this.unary(() => this.rpc.getModelInfo(create(GetModelInfoRequestSchema), this.call(options)));
  }

  /**
   * Closes the connection; calls still running fail with UNAVAILABLE/CANCELLED. (Not
   * needed for the process to exit: an idle connection does not keep Node alive.)
   */
  close(): void {
    this.sessions?.abort();
  }

  private async unary<T>(run: () => Promise<T>): Promise<T> {
    try {
      return await run();
    } catch (e) {
      throw toLLMServeError(e);
    }
  }
}
