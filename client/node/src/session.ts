/**
 * A multi-turn session: one Generate stream, one KV slot on the server.
 *
 * A gRPC deadline covers the whole stream, so a turn's own time limit is kept here, as
 * the Python SDK does: when it passes, the turn is cancelled in band (the server ends it
 * CANCELLED; the session and its KV stay) and the caller gets DeadlineExceeded. Should
 * the turn still not end CANCEL_GRACE_MS later, the stream itself is aborted.
 *
 * @module
 */
import { create } from "@bufbuild/protobuf";
import type { Client as ConnectClient } from "@connectrpc/connect";
import { Code } from "@connectrpc/connect";
import {
  FinishReason,
  GenerateRequestSchema,
  type GenerateRequest,
  type GenerateResponse,
  type LLMService,
  type SessionConfig,
  type TokenChunk,
  type TurnEnd,
} from "./gen/llmserve/v1/llmserve_pb.js";
import { clientError, toLLMServeError } from "./errors.js";
import { AsyncQueue } from "./queue.js";
import { makeInput, type Prompt } from "./requests.js";
import { collect, type GenerateResult } from "./results.js";
import { settle } from "./stream.js";
import { anySignal } from "./time.js";

/** How long a turn past its limit may take to end once cancelled, before the stream is aborted. */
export const CANCEL_GRACE_MS = 5000;

/** Options of one Generate stream (the session). */
export interface SessionCallOptions {
  /** Deadline of the whole stream, in ms (default: the client's). */
  timeoutMs?: number;
  /** Aborts the stream. */
  signal?: AbortSignal;
  /** Headers of the call. */
  headers?: Record<string, string>;
}

/** Options of one turn. */
export interface TurnOptions {
  /** The turn's own time limit, in ms: past it the turn is cancelled and DeadlineExceeded thrown. */
  timeoutMs?: number;
}

/**
 * Turns on one Generate stream. The session's config goes with its first turn's
 * input, in the stream's first message. `send()` a turn's input and iterate its chunks, or
 * `ask()` for the whole turn; `turnEnd` holds the last turn's end (sample 0's;
 * `turnEnds` every sample's). `cancel()` stops the running turn, `close()` ends the
 * session (half-close, then waits for the stream's end), `abort()` drops the stream.
 * One turn at a time: a turn left before its end is cancelled, and the next turn
 * first reads the rest of it.
 */
export class Session {
  /** The last turn's end (sample 0's). */
  turnEnd: TurnEnd | undefined;
  /** The last turn's ends, one per sample. */
  turnEnds: TurnEnd[] = [];
  private readonly requests = new AsyncQueue<GenerateRequest>();
  private readonly responses: AsyncIterator<GenerateResponse>;
  private readonly controller = new AbortController();
  private readonly samples: number;
  private unfinished = 0; // turn ends still to read from an abandoned turn
  private busy = false;
  private config: SessionConfig | undefined; // sent with the first message

  /** Queues a request; the session's first message also carries its config. */
  private push(init: { input?: GenerateRequest["input"]; endOfTurn?: boolean; cancel?: boolean }): void {
    this.requests.push(create(GenerateRequestSchema, { ...init, ...(this.config ? { config: this.config } : {}) }));
    this.config = undefined;
  }

  /** Use `Client.session()`. */
  constructor(rpc: ConnectClient<typeof LLMService>, config: SessionConfig, call: SessionCallOptions = {}) {
    this.samples = config.n ?? 1;
    this.config = config;
    const signal = anySignal(this.controller.signal, call.signal);
    const stream = rpc.generate(this.requests, { timeoutMs: call.timeoutMs, signal, headers: call.headers });
    this.responses = stream[Symbol.asyncIterator]();
  }

  private async next(): Promise<GenerateResponse | undefined> {
    const r = await this.responses.next();
    return r.done ? undefined : r.value;
  }

  /**
   * Sends one turn's input and yields its responses (prompt logprobs, chunks, turn
   * ends) up to the last sample's turn end.
   */
  async *responsesOf(prompt: Prompt, options: TurnOptions = {}): AsyncGenerator<GenerateResponse> {
    if (this.busy) throw new Error("llmserve: a session runs one turn at a time");
    this.busy = true;
    let expired = false;
    const ends: TurnEnd[] = [];
    const timers: NodeJS.Timeout[] = [];
    try {
      while (this.unfinished > 0) {
        const r = await this.next();
        if (!r) break;
        if (r.event.case === "turnEnd") this.unfinished--;
      }
      this.unfinished = 0;
      this.push({ input: makeInput(prompt), endOfTurn: true });
      if (options.timeoutMs !== undefined) {
        timers.push(setTimeout(() => ((expired = true), this.cancel()), options.timeoutMs));
        timers.push(setTimeout(() => this.abort(), options.timeoutMs + CANCEL_GRACE_MS));
      }
      while (ends.length < this.samples) {
        const r = await this.next();
        if (!r) throw clientError(Code.Internal, "the Generate stream ended before the turn did");
        if (r.event.case === "turnEnd") ends.push(r.event.value);
        yield r;
      }
    } catch (e) {
      if (expired) throw clientError(Code.DeadlineExceeded, `the turn ran past its ${options.timeoutMs} ms limit`);
      throw toLLMServeError(e);
    } finally {
      timers.forEach(clearTimeout);
      if (ends.length < this.samples && !this.controller.signal.aborted) {
        this.unfinished = this.samples - ends.length; // left early: stop the turn, read its end next time
        this.cancel();
      }
      this.turnEnds = ends;
      this.turnEnd = ends.find((e) => e.index === 0) ?? this.turnEnd;
      this.busy = false;
    }
    if (expired && ends.some((e) => e.finishReason === FinishReason.CANCELLED)) {
      throw clientError(Code.DeadlineExceeded, `the turn ran past its ${options.timeoutMs} ms limit`);
    }
  }

  /** Sends one turn's input; yields its chunks (every sample's when n > 1). */
  async *send(prompt: Prompt, options: TurnOptions = {}): AsyncGenerator<TokenChunk> {
    for await (const r of this.responsesOf(prompt, options)) {
      if (r.event.case === "chunk") yield r.event.value;
    }
  }

  /** Runs one turn to its end: the text, token ids and turn end. */
  ask(prompt: Prompt, options: TurnOptions = {}): Promise<GenerateResult> {
    return collect(this.responsesOf(prompt, options));
  }

  /** Stops the running turn (it ends CANCELLED); the session and its KV stay. */
  cancel(): void {
    this.push({ cancel: true });
  }

  /** Ends the session: half-closes the stream and reads it to its end (status OK). */
  async close(): Promise<void> {
    if (this.config) this.push({});
    this.requests.end();
    try {
      while (await this.next());
    } catch (e) {
      throw toLLMServeError(e);
    }
  }

  /** Drops the stream at once (the server sees CANCELLED). */
  abort(): void {
    this.requests.end();
    if (!this.controller.signal.aborted) settle(this.controller, this.responses);
  }
}
