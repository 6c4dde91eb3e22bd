/**
 * Typed errors: every failed call rejects with an {@link LLMServeError} subclass that
 * names the gRPC status and carries the google.rpc details the server sent in
 * `grpc-status-details-bin` (BadRequest field violations, RetryInfo).
 *
 * @module
 */
import { Code, ConnectError } from "@connectrpc/connect";
import { timestampMs } from "./time.js";
import { BadRequestSchema, RetryInfoSchema } from "./gen/google/rpc/error_details_pb.js";

/** gRPC's status code names ("INVALID_ARGUMENT", ...), by Connect's numeric code. */
export const CODE_NAMES: Readonly<Record<number, string>> = {
  0: "OK", 1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT", 4: "DEADLINE_EXCEEDED",
  5: "NOT_FOUND", 6: "ALREADY_EXISTS", 7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED",
  9: "FAILED_PRECONDITION", 10: "ABORTED", 11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED",
  13: "INTERNAL", 14: "UNAVAILABLE", 15: "DATA_LOSS", 16: "UNAUTHENTICATED",
};

/** One google.rpc.BadRequest field violation: the request field and what is wrong with it. */
export interface FieldViolation {
  readonly field: string;
  readonly description: string;
}

/**
 * A failed call. `code` is the gRPC status code (Connect's `Code`, the same numbers),
 * `codeName` its gRPC name, `rawMessage` the server's status message.
 * `fieldViolations` (and `field`, the first one's field) come from a google.rpc.BadRequest
 * detail; `retryAfterMs` from a google.rpc.RetryInfo detail (or the
 * `grpc-retry-pushback-ms` trailer). `metadata` holds the response headers and trailers.
 */
export class LLMServeError extends Error {
  readonly code: Code;
  readonly codeName: string;
  readonly rawMessage: string;
  readonly metadata: Headers;
  readonly fieldViolations: readonly FieldViolation[];
  readonly field: string | undefined;
  readonly retryAfterMs: number | undefined;

  /** Wraps a ConnectError (see {@link toLLMServeError} for any thrown value). */
  constructor(err: ConnectError) {
    super(`${CODE_NAMES[err.code] ?? err.code}: ${err.rawMessage}`, { cause: err });
    this.name = new.target.name;
    this.code = err.code;
    this.codeName = CODE_NAMES[err.code] ?? String(err.code);
    this.rawMessage = err.rawMessage;
    this.metadata = err.metadata;
    const violations: FieldViolation[] = [];
    let retryAfterMs: number | undefined;
    try {
      for (const bad of err.findDetails(BadRequestSchema)) {
        for (const v of bad.fieldViolations) violations.push({ field: v.field, description: v.description });
      }
      for (const retry of err.findDetails(RetryInfoSchema)) {
        if (retry.retryDelay) retryAfterMs = timestampMs(retry.retryDelay);
      }
    } catch {
      // undecodable details are ignored, as gRPC would
    }
    const pushback = Number.parseInt(err.metadata.get("grpc-retry-pushback-ms") ?? "", 10);
    this.fieldViolations = violations;
    this.field = violations[0]?.field;
    this.retryAfterMs = retryAfterMs ?? (Number.isFinite(pushback) && pushback >= 0 ? pushback : undefined);
  }
}

/** INVALID_ARGUMENT: the request is wrong; see `fieldViolations`. */
export class InvalidArgument extends LLMServeError {}
/** RESOURCE_EXHAUSTED: the waiting queue is full; retry after `retryAfterMs`. */
export class ResourceExhausted extends LLMServeError {}
/** UNAVAILABLE: the server is unreachable, loading or draining. */
export class Unavailable extends LLMServeError {}
/** DEADLINE_EXCEEDED: the call's (or the turn's) deadline passed. */
export class DeadlineExceeded extends LLMServeError {}
/** CANCELLED: the call was cancelled (an AbortSignal, or the server). */
export class Cancelled extends LLMServeError {}
/** FAILED_PRECONDITION: the server cannot do this (e.g. Embed without --embeddings). */
export class FailedPrecondition extends LLMServeError {}
/** UNAUTHENTICATED: no API key, or a wrong one. */
export class Unauthenticated extends LLMServeError {}
/** PERMISSION_DENIED. */
export class PermissionDenied extends LLMServeError {}
/** INTERNAL: the server failed. */
export class Internal extends LLMServeError {}

const BY_CODE: Partial<Record<Code, new (err: ConnectError) => LLMServeError>> = {
  [Code.InvalidArgument]: InvalidArgument,
  [Code.ResourceExhausted]: ResourceExhausted,
  [Code.Unavailable]: Unavailable,
  [Code.DeadlineExceeded]: DeadlineExceeded,
  [Code.Canceled]: Cancelled,
  [Code.FailedPrecondition]: FailedPrecondition,
  [Code.Unauthenticated]: Unauthenticated,
  [Code.PermissionDenied]: PermissionDenied,
  [Code.Internal]: Internal,
};

/** The typed error for anything a call threw (a ConnectError, an AbortError, ...). */
export function toLLMServeError(reason: unknown): LLMServeError {
  if (reason instanceof LLMServeError) return reason;
  const err = ConnectError.from(reason);
  const Type = BY_CODE[err.code] ?? LLMServeError;
  return new Type(err);
}

/** A typed error made on the client's side (no server status behind it). */
export function clientError(code: Code, message: string): LLMServeError {
  return toLLMServeError(new ConnectError(message, code));
}
