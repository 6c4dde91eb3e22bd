/** Shared by the tests: the live server's address (LLMSERVE_ADDRESS) and a client. */
import { Client, type ClientOptions } from "../src/index.js";

export const ADDRESS = process.env.LLMSERVE_ADDRESS ?? "127.0.0.1:50051";

/** A client of the live server with a generous default deadline. */
export function liveClient(options: ClientOptions = {}): Client {
  return new Client({ address: ADDRESS, timeoutMs: 120_000, ...options });
}
