// One-shot generation and the unary calls, against the live server (LLMSERVE_ADDRESS).
import assert from "node:assert/strict";
import { after, test } from "node:test";
import { pb } from "../src/index.js";
import { liveClient } from "./helpers.js";

const client = liveClient();
after(() => client.close());

test("generate: one turn over GenerateOnce, collected", async () => {
  const result = await client.generate("The capital of France is", { maxTokens: 8, temperature: 0 });
  assert.equal(result.turnEnd.finishReason, pb.FinishReason.LENGTH);
  assert.equal(result.turnEnd.usage?.completionTokens, 8);
  assert.equal(result.tokenIds.length, 8);
  assert.ok(result.text.length > 0);
  assert.equal(result.samples.length, 1);
});

test("streamOnce and stream yield the same greedy chunks as generateText", async () => {
  const options = { maxTokens: 6, temperature: 0 };
  const once: string[] = [];
  for await (const r of client.streamOnce("Once upon a time", options)) {
    if (r.event.case === "chunk") once.push(r.event.value.text);
  }
  const bidi: string[] = [];
  let end: pb.TurnEnd | undefined;
  for await (const r of client.stream("Once upon a time", options)) {
    if (r.event.case === "chunk") bidi.push(r.event.value.text);
    if (r.event.case === "turnEnd") end = r.event.value;
  }
  const text = await client.generateText("Once upon a time", options);
  assert.ok(once.length >= 2, "streamed in several chunks");
  // Like with like: each call lands on the slot the previous one left, samples its first
  // token from the logits saved there and decodes alone in the same cells (the suite runs
  // one test at a time), so the digits, and the greedy picks, are the same on any CPU.
  assert.equal(once.join(""), bidi.join(""));
  assert.equal(text.samples[0]?.text, once.join(""));
  assert.equal(end?.finishReason, pb.FinishReason.LENGTH);
});

test("n = 2 samples come back told apart by index", async () => {
  const result = await client.generate("Hello", { maxTokens: 4, n: 2, seed: 7 });
  assert.equal(result.samples.length, 2);
  assert.deepEqual(result.samples.map((s) => s.turnEnd.index), [0, 1]);
});

test("tokenize, detokenize and modelInfo", async () => {
  const ids = await client.tokenize("Hello world", { addSpecial: false });
  assert.ok(ids.length >= 2);
  assert.equal(await client.detokenize(ids), "Hello world");
  const info = await client.modelInfo();
  assert.ok(info.canGenerate && info.canEmbed);
  assert.ok(info.nCtx > 0 && (info.embeddingModel?.nEmbd ?? 0) > 0);
  assert.equal(typeof info.numParameters, "bigint");
});
