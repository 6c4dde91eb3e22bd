// Embed with backpressure, against the live server (LLMSERVE_ADDRESS).
import assert from "node:assert/strict";
import { setTimeout as sleep } from "node:timers/promises";
import { after, test } from "node:test";
import type { EmbedProgress } from "../src/index.js";
import { liveClient } from "./helpers.js";

const client = liveClient();
after(() => client.close());

test("200 texts: in order, unit length, at most maxInFlight unanswered, read lazily", async () => {
  const info = await client.modelInfo();
  const dim = info.embeddingModel!.nEmbd;
  let pulled = 0;
  function* texts() {
    for (let i = 0; i < 200; i++) {
      pulled++;
      yield `Sentence number ${i} for the TypeScript client.`;
    }
  }
  const maxInFlight = 24;
  const batchSize = 8;
  let peak = 0;
  let lead = 0; // inputs read from the iterable ahead of the results taken
  const onProgress = (p: EmbedProgress) => (peak = Math.max(peak, p.inFlight));
  let count = 0;
  for await (const e of client.embed(texts(), { batchSize, maxInFlight, onProgress })) {
    assert.equal(e.index, count++);
    assert.equal(e.vector.length, dim);
    const norm = Math.sqrt(e.vector.reduce((s, x) => s + x * x, 0));
    assert.ok(Math.abs(norm - 1) < 1e-3, `norm ${norm}`);
    lead = Math.max(lead, pulled - count);
    if (count % 50 === 0) await sleep(20); // a slow consumer now and then
  }
  assert.equal(count, 200);
  assert.ok(peak > 0 && peak <= maxInFlight, `peak in flight ${peak}`);
  // The producer never ran ahead of the consumer by more than the bound and a batch being filled.
  assert.ok(lead <= maxInFlight + batchSize, `read ${lead} inputs ahead`);
});

test("embedAll keeps input order; leaving early cancels the stream", async () => {
  const vectors = await client.embedAll(["a red apple", "a green pear"], { normalize: false });
  assert.equal(vectors.length, 2);
  let seen = 0;
  for await (const _ of client.embed(Array.from({ length: 100 }, (_, i) => `text ${i}`), { batchSize: 4 })) {
    if (++seen === 3) break;
  }
  assert.equal(seen, 3);
});
