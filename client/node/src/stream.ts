/** Iterating a streaming call so that leaving it early cancels it cleanly. @module */
import { toLLMServeError } from "./errors.js";
import { anySignal } from "./time.js";

/**
 * Runs `start(signal)` and yields its messages; errors become LLMServeErrors. When the
 * caller leaves early the call is aborted, and its iterator read once more: Connect
 * clears the call's deadline timer only when the call settles, and that timer would
 * otherwise keep the process alive until the deadline.
 */
export async function* cancellable<T>(
  start: (signal: AbortSignal) => AsyncIterable<T>,
  signal?: AbortSignal,
): AsyncGenerator<T> {
  const controller = new AbortController();
  const it = start(anySignal(controller.signal, signal))[Symbol.asyncIterator]();
  let settled = false;
  try {
    for (;;) {
      const r = await it.next();
      if (r.done) {
        settled = true;
        return;
      }
      yield r.value;
    }
  } catch (e) {
    settled = true;
    throw toLLMServeError(e);
  } finally {
    if (!settled) settle(controller, it);
  }
}

/** Aborts a call and lets Connect settle it (see `cancellable`): reads it to its error or end. */
export function settle(controller: AbortController, it: AsyncIterator<unknown>): void {
  controller.abort();
  void (async () => {
    for (;;) if ((await it.next()).done) return;
  })().catch(() => undefined);
}
