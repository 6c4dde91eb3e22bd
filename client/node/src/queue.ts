/** A push-fed async iterable: the request side of a bidi stream. @module */

/**
 * Items pushed with `push()` come out of the iterator in order; `end()` finishes it
 * (the stream's half-close). It may be iterated once.
 */
export class AsyncQueue<T> implements AsyncIterable<T> {
  private items: T[] = [];
  private ended = false;
  private waiter: (() => void) | undefined;

  /** Queues an item; ignored after `end()`. */
  push(item: T): void {
    if (this.ended) return;
    this.items.push(item);
    this.wake();
  }

  /** No more items: the iterator finishes once the queued ones are taken. */
  end(): void {
    this.ended = true;
    this.wake();
  }

  get isEnded(): boolean {
    return this.ended;
  }

  private wake(): void {
    const waiter = this.waiter;
    this.waiter = undefined;
    waiter?.();
  }

  async *[Symbol.asyncIterator](): AsyncIterator<T> {
    for (;;) {
      if (this.items.length > 0) {
        yield this.items.shift()!;
      } else if (this.ended) {
        return;
      } else {
        await new Promise<void>((resolve) => (this.waiter = resolve));
      }
    }
  }
}
