/**
 * Embed with backpressure: inputs are read lazily (any iterable or async iterable),
 * sent in batches, and at most `maxInFlight` inputs are sent but not yet answered.
 * The request side waits for results to be taken by the caller before it sends more,
 * so a slow consumer (or a slow server) holds the producer back, and memory stays
 * bounded however many inputs there are. HTTP/2 flow control paces the bytes below.
 *
 * @module
 */
import type { Client as ConnectClient } from "@connectrpc/connect";
import type { EmbedRequest, Input, LLMService } from "./gen/llmserve/v1/llmserve_pb.js";
import { embedRequest, makeInput, type EmbedOptionsInit, type Prompt } from "./requests.js";
import { cancellable } from "./stream.js";

/** One result: its input's position, the vector, the input's token count. */
export interface Embedding {
  /** Position of the input in the stream (0-based). */
  readonly index: number;
  readonly vector: number[];
  readonly numTokens: number;
  /** The input was cut to one ubatch (EmbedOptions.truncate). */
  readonly truncated: boolean;
}

/** Counters of a running Embed stream, for `onProgress`. */
export interface EmbedProgress {
  /** Inputs sent so far. */
  readonly sent: number;
  /** Results received so far. */
  readonly received: number;
  /** sent - received: inputs the server has and has not answered yet. */
  readonly inFlight: number;
}

/** Options of one Embed call. */
export interface EmbedCallOptions extends EmbedOptionsInit {
  /** Inputs per EmbedRequest message (default 32). */
  batchSize?: number;
  /** Most inputs sent and not yet answered (default 256; at least one batch is always allowed). */
  maxInFlight?: number;
  /** Called after each batch is sent and each result received. */
  onProgress?: (progress: EmbedProgress) => void;
  /** Deadline of the stream, in ms (default: the client's). */
  timeoutMs?: number;
  /** Aborts the stream. */
  signal?: AbortSignal;
  /** Headers of the call. */
  headers?: Record<string, string>;
  /** A further embedding model's name (`-m NAME=PATH`); unset: the default model's embeddings. */
  model?: string;
}

/** Runs one Embed stream over `inputs`; yields one Embedding per input, in input order. */
export async function* embedStream(
  rpc: ConnectClient<typeof LLMService>,
  inputs: Iterable<Prompt> | AsyncIterable<Prompt>,
  options: EmbedCallOptions = {},
): AsyncGenerator<Embedding> {
  const batchSize = Math.max(1, options.batchSize ?? 32);
  const maxInFlight = Math.max(1, options.maxInFlight ?? 256);
  const embedOptions: EmbedOptionsInit = {
    normalize: options.normalize ?? true,
    truncate: options.truncate ?? false,
    ...(options.addBos === undefined ? {} : { addBos: options.addBos }),
  };
  let sent = 0;
  let received = 0;
  let waiter: (() => void) | undefined;
  let finished = false;
  const wake = () => {
    const w = waiter;
    waiter = undefined;
    w?.();
  };
  const progress = () => options.onProgress?.({ sent, received, inFlight: sent - received });
  const room = async (n: number) => {
    while (!finished && sent > received && sent - received + n > maxInFlight) {
      await new Promise<void>((resolve) => (waiter = resolve));
    }
  };
  async function* requests(): AsyncGenerator<EmbedRequest> {
    let batch: Input[] = [];
    let first = true;
    const flush = async function* () {
      await room(batch.length);
      if (finished) return;
      const request = embedRequest(batch, first ? embedOptions : undefined);
      if (first && options.model) request.model = options.model;
      sent += batch.length;
      batch = [];
      first = false;
      progress();
      yield request;
    };
    for await (const item of inputs) {
      if (finished) return;
      batch.push(makeInput(item));
      if (batch.length >= batchSize) yield* flush();
    }
    if (batch.length > 0 || first) yield* flush();
  }
  const call = cancellable(
    (signal) => rpc.embed(requests(), { timeoutMs: options.timeoutMs, signal, headers: options.headers }),
    options.signal,
  );
  try {
    for await (const r of call) {
      received++;
      progress();
      wake();
      yield { index: Number(r.index), vector: r.embedding, numTokens: r.numTokens, truncated: r.truncated };
    }
  } finally {
    finished = true; // a producer waiting for room stops
    wake();
  }
}
