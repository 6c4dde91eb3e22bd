// Multi-turn sessions and cancel, against the live server (LLMSERVE_ADDRESS).
import assert from "node:assert/strict";
import { after, test } from "node:test";
import { DeadlineExceeded, pb } from "../src/index.js";
import { liveClient } from "./helpers.js";

const client = liveClient();
after(() => client.close());

test("a two-turn session prefills only the new turn (cached_tokens > 0)", async () => {
  const session = client.session({ temperature: 0, maxTokens: 8 });
  const first = await session.ask("The three primary colours are");
  const chunks: string[] = [];
  for await (const chunk of session.send(" And the three secondary colours are")) chunks.push(chunk.text);
  const second = session.turnEnd!;
  await session.close();
  assert.ok(first.text.length > 0 && chunks.length >= 2);
  const firstPrompt = first.turnEnd.usage!.promptTokens;
  assert.ok(firstPrompt > 0);
  assert.ok(second.usage!.cachedTokens >= firstPrompt, `cached ${second.usage!.cachedTokens} < ${firstPrompt}`);
});

test("cancel stops the running turn; the session goes on", async () => {
  const session = client.session({ maxTokens: 400, ignoreEos: true });
  let n = 0;
  for await (const _ of session.send("Write a very long story about a lighthouse keeper.")) {
    if (n++ === 0) session.cancel();
  }
  const end = session.turnEnd!;
  assert.equal(end.finishReason, pb.FinishReason.CANCELLED);
  assert.ok(end.usage!.completionTokens > 0 && end.usage!.completionTokens < 400);
  for await (const _ of session.send(" The end.")) session.cancel(); // a second turn on the same KV
  // The history holds the prompt and the reply; the reply's last sampled token is not in the KV yet.
  const inHistory = end.usage!.promptTokens + end.usage!.completionTokens - 1;
  const cached = session.turnEnd!.usage!.cachedTokens;
  assert.ok(cached >= inHistory, `cached ${cached} < ${inHistory}`);
  await session.close();
});

test("a turn past its own limit is DeadlineExceeded and the session stays usable", async () => {
  const session = client.session({ maxTokens: 24, ignoreEos: true });
  await assert.rejects(session.ask("Count to a thousand:", { timeoutMs: 100 }), DeadlineExceeded);
  assert.equal(session.turnEnd?.finishReason, pb.FinishReason.CANCELLED);
  const next = await session.ask(" Stop.", { timeoutMs: 60_000 });
  assert.ok(next.turnEnd.usage!.completionTokens > 0);
  await session.close();
});

test("leaving a turn early cancels it; the next turn reads past its end", async () => {
  const session = client.session({ maxTokens: 32, ignoreEos: true, temperature: 0 });
  for await (const _ of session.send("Tell me about the sea.")) break;
  const next = await session.ask(" In short:", { timeoutMs: 60_000 });
  assert.equal(next.turnEnd.finishReason, pb.FinishReason.LENGTH);
  await session.close();
});
