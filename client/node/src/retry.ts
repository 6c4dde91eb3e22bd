/**
 * Retries of unary calls, as llmserve's published gRPC service config
 * (client/llmserve/client/service_config.json) asks of every client: a call that ends
 * UNAVAILABLE (the server is loading, draining or unreachable) or RESOURCE_EXHAUSTED
 * (its waiting queue is full) is tried again, 5 attempts in all, after a random
 * backoff of up to 0.5 s, 1 s, 2 s, 4 s (at most 5 s); the server's
 * `grpc-retry-pushback-ms` trailer replaces the backoff (a negative or malformed one
 * stops retrying, gRFC A6). A token bucket (10 tokens; a failed attempt takes one, a
 * success gives back 0.1) stops retries while half or less is left. No attempt starts
 * past the call's deadline, and each attempt's `grpc-timeout` is what is left of it.
 *
 * Connect has no gRPC service-config support, so this is an interceptor. Streaming
 * calls are not retried (gRPC would retry them only before their first response).
 *
 * @module
 */
import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";
import { sleep } from "./time.js";

/** The retry policy; the defaults are service_config.json's. */
export interface RetryPolicy {
  /** Attempts in all, the first included (default 5). */
  maxAttempts?: number;
  /** Backoff before the first retry, in ms (default 500). */
  initialBackoffMs?: number;
  /** Largest backoff, in ms (default 5000). */
  maxBackoffMs?: number;
  /** Backoff growth per retry (default 2). */
  backoffMultiplier?: number;
  /** Status codes retried (default UNAVAILABLE, RESOURCE_EXHAUSTED). */
  retryableCodes?: Code[];
  /** Token bucket size (default 10); 0 turns throttling off. */
  throttleMaxTokens?: number;
  /** Tokens a success gives back (default 0.1). */
  throttleTokenRatio?: number;
  /** Called before each retry: the attempt that failed (1-based), its error, the wait in ms. */
  onRetry?: (attempt: number, error: ConnectError, delayMs: number) => void;
}

const DEFAULTS: Required<Omit<RetryPolicy, "onRetry">> = {
  maxAttempts: 5,
  initialBackoffMs: 500,
  maxBackoffMs: 5000,
  backoffMultiplier: 2,
  retryableCodes: [Code.Unavailable, Code.ResourceExhausted],
  throttleMaxTokens: 10,
  throttleTokenRatio: 0.1,
};

const TIMEOUT_UNITS: Record<string, number> = { H: 3_600_000, M: 60_000, S: 1000, m: 1, u: 1e-3, n: 1e-6 };

/** A gRPC `grpc-timeout` header value in ms (undefined when absent or malformed). */
export function parseGrpcTimeout(value: string | null): number | undefined {
  const match = value ? /^(\d{1,8})([HMSmun])$/.exec(value) : null;
  return match ? Number(match[1]) * TIMEOUT_UNITS[match[2]!]! : undefined;
}

/** The interceptor that retries unary calls under `policy` (one bucket per interceptor). */
export function retryInterceptor(policy: RetryPolicy = {}): Interceptor {
  const p = { ...DEFAULTS, ...policy };
  let tokens = p.throttleMaxTokens;
  const throttled = () => p.throttleMaxTokens > 0 && tokens <= p.throttleMaxTokens / 2;
  return (next) => async (req) => {
    if (req.stream) return next(req);
    const timeoutMs = parseGrpcTimeout(req.header.get("grpc-timeout"));
    const deadline = timeoutMs === undefined ? undefined : Date.now() + timeoutMs;
    let backoff = p.initialBackoffMs;
    for (let attempt = 1; ; attempt++) {
      try {
        const res = await next(req);
        tokens = Math.min(p.throttleMaxTokens, tokens + p.throttleTokenRatio);
        return res;
      } catch (e) {
        const err = ConnectError.from(e);
        if (!p.retryableCodes.includes(err.code) || req.signal.aborted) throw e;
        tokens = Math.max(0, tokens - 1);
        if (attempt >= p.maxAttempts || throttled()) throw e;
        const pushback = err.metadata.get("grpc-retry-pushback-ms");
        let delay: number;
        if (pushback !== null) {
          if (!/^\d+$/.test(pushback.trim())) throw e; // the server says: do not retry
          delay = Number(pushback);
        } else {
          delay = Math.random() * backoff;
        }
        backoff = Math.min(backoff * p.backoffMultiplier, p.maxBackoffMs);
        if (deadline !== undefined && Date.now() + delay >= deadline) throw e;
        p.onRetry?.(attempt, err, delay);
        await sleep(delay, req.signal).catch((reason: unknown) => {
          throw ConnectError.from(reason ?? e, Code.Canceled);
        });
        if (deadline !== undefined) req.header.set("grpc-timeout", `${Math.max(1, deadline - Date.now())}m`);
      }
    }
  };
}
