// Typed errors and deadlines, against the live server (LLMSERVE_ADDRESS).
import assert from "node:assert/strict";
import { after, test } from "node:test";
import { DeadlineExceeded, InvalidArgument, LLMServeError, Unavailable, Code } from "../src/index.js";
import { Client } from "../src/index.js";
import { liveClient } from "./helpers.js";

const client = liveClient();
after(() => client.close());

test("a bad request is InvalidArgument with the BadRequest field violation", async () => {
  const err = await client.session({ maxTokens: -1 }).ask("Hi").then(
    () => assert.fail("max_tokens -1 was accepted"),
    (e: unknown) => e,
  );
  assert.ok(err instanceof InvalidArgument, String(err));
  assert.ok(err instanceof LLMServeError);
  assert.equal(err.code, Code.InvalidArgument);
  assert.equal(err.codeName, "INVALID_ARGUMENT");
  assert.equal(err.field, "config.stopping.max_tokens");
  assert.match(err.fieldViolations[0]!.description, /max_tokens/);
});

test("the same violation over GenerateOnce and GenerateText", async () => {
  await assert.rejects(client.generate("Hi", { maxTokens: -1 }), (e: unknown) =>
    e instanceof InvalidArgument && e.field === "config.stopping.max_tokens");
  await assert.rejects(client.generateText([2, -1], { maxTokens: 2 }), (e: unknown) =>
    e instanceof InvalidArgument && e.fieldViolations.length > 0);
});

test("a call past its deadline is DeadlineExceeded", async () => {
  const started = Date.now();
  await assert.rejects(
    client.generate("Write a very long story.", { maxTokens: 400, ignoreEos: true, timeoutMs: 250 }),
    DeadlineExceeded,
  );
  assert.ok(Date.now() - started < 10_000);
  // The client's default deadline applies to unary calls too.
  const hasty = liveClient({ timeoutMs: 1 });
  await assert.rejects(hasty.generateText("Write a very long story.", { maxTokens: 200, ignoreEos: true }), DeadlineExceeded);
  hasty.close();
});

test("an unreachable server is Unavailable, after the retries", async () => {
  const retries: number[] = [];
  const down = new Client({
    address: "127.0.0.1:1",
    retries: { initialBackoffMs: 10, maxBackoffMs: 20, onRetry: (attempt) => retries.push(attempt) },
  });
  await assert.rejects(down.modelInfo({ timeoutMs: 10_000 }), Unavailable);
  assert.deepEqual(retries, [1, 2, 3, 4]);
  down.close();
});
