/**
 * How a client reaches a server: the gRPC (HTTP/2) transport of @connectrpc/connect-node,
 * TLS or mTLS, the API key as `authorization: Bearer <key>`, the default deadline, the
 * retry policy and keepalive pings.
 *
 * @module
 */
import type { Interceptor, Transport } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";
import { retryInterceptor, type RetryPolicy } from "./retry.js";

/** The header a load balancer hashes to keep a session's calls on one replica. */
export const AFFINITY_HEADER = "x-llmserve-affinity";

/** TLS settings: PEM contents (strings or Buffers), not file names. */
export interface TlsOptions {
  /** CA certificates to trust instead of the system roots. */
  ca?: string | Buffer;
  /** Client certificate chain, for mTLS (with `key`). */
  cert?: string | Buffer;
  /** Client private key, for mTLS (with `cert`). */
  key?: string | Buffer;
  /** The name the server's certificate must carry when the address does not name it. */
  serverName?: string;
}

/** How to reach a server; every field is optional. */
export interface ClientOptions {
  /** "host:port" (default "127.0.0.1:50051") or a URL ("http://host:port", "https://host:port"). */
  address?: string;
  /** Sent as `authorization: Bearer <key>` on every call. */
  apiKey?: string;
  /** Use TLS: `true` trusts the system roots; an object gives CA / client certificate (mTLS). */
  tls?: boolean | TlsOptions;
  /** Default deadline of each call, in ms (a call's own `timeoutMs` wins; undefined: none). */
  timeoutMs?: number;
  /** The service config's retry policy for unary calls; `false` turns retries off. */
  retries?: boolean | RetryPolicy;
  /** More headers sent on every call, e.g. a W3C `traceparent`. */
  headers?: Record<string, string>;
  /** Sent as `x-llmserve-affinity` on Generate calls; without it a named session's id is sent. */
  affinityKey?: string;
  /** Without either: send a key derived from a one-shot call's input head (affinity.ts). */
  deriveAffinity?: boolean;
  /** Further Connect interceptors, run inside the client's own (auth, headers, retries). */
  interceptors?: Interceptor[];
  /** Use this transport instead of opening one (the options above then only add headers). */
  transport?: Transport;
}

/** The interceptor that adds `authorization: Bearer <apiKey>` and `headers` to every call. */
export function headersInterceptor(apiKey: string | undefined, headers: Record<string, string> = {}): Interceptor {
  return (next) => async (req) => {
    if (apiKey) req.header.set("authorization", `Bearer ${apiKey}`);
    for (const [key, value] of Object.entries(headers)) req.header.set(key, value);
    return next(req);
  };
}

/** The base URL Connect wants, from "host:port" or a URL. */
export function baseUrl(address: string, tls: boolean): string {
  if (/^https?:\/\//.test(address)) return address;
  return `${tls ? "https" : "http"}://${address}`;
}

/** The interceptors a client runs: headers, then retries, then the caller's. */
export function clientInterceptors(options: ClientOptions): Interceptor[] {
  const retries = options.retries ?? true;
  return [
    headersInterceptor(options.apiKey, options.headers),
    ...(retries === false ? [] : [retryInterceptor(retries === true ? {} : retries)]),
    ...(options.interceptors ?? []),
  ];
}

/** A transport and the HTTP/2 session manager whose `abort()` closes its connection. */
export interface OpenTransport {
  transport: Transport;
  sessions: Http2SessionManager;
}

/**
 * The gRPC transport for `options`. Keepalive as the Python SDK's: a ping every 30 s
 * while calls are open (the server accepts one every 10 s), none on an idle
 * connection, and a connection whose ping is unanswered for 20 s is dropped.
 */
export function openTransport(options: ClientOptions): OpenTransport {
  const address = options.address ?? "127.0.0.1:50051";
  const tls = options.tls ?? false;
  const secure = tls !== false || address.startsWith("https://");
  const t: TlsOptions = typeof tls === "object" ? tls : {};
  if (Boolean(t.cert) !== Boolean(t.key)) throw new TypeError("mTLS needs both tls.cert and tls.key");
  const url = baseUrl(address, secure);
  const nodeOptions = secure
    ? { ...(t.ca ? { ca: t.ca } : {}), ...(t.cert ? { cert: t.cert, key: t.key } : {}), ...(t.serverName ? { servername: t.serverName } : {}) }
    : {};
  const sessions = new Http2SessionManager(url, { pingIntervalMs: 30_000, pingTimeoutMs: 20_000, pingIdleConnection: false }, nodeOptions);
  const transport = createGrpcTransport({
    baseUrl: url,
    interceptors: clientInterceptors(options),
    defaultTimeoutMs: options.timeoutMs,
    sessionManager: sessions,
  });
  return { transport, sessions };
}
