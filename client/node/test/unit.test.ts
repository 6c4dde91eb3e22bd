// No server: the interceptors (API key, retries) and the error decoding, over an
// in-memory Connect router that implements LLMService.
import assert from "node:assert/strict";
import { create } from "@bufbuild/protobuf";
import { DurationSchema } from "@bufbuild/protobuf/wkt";
import { createRouterTransport } from "@connectrpc/connect";
import { test } from "node:test";
import { Client, Code, ConnectError, ResourceExhausted, Unauthenticated, makeInput, pb, parseGrpcTimeout, prefixAffinityKey, sessionConfig } from "../src/index.js";
import { clientInterceptors, type ClientOptions } from "../src/connection.js";
import { BadRequestSchema, RetryInfoSchema } from "../src/gen/google/rpc/error_details_pb.js";
import { StringListSchema } from "../src/gen/llmserve/v1/llmserve_pb.js";

/** A client over an in-memory LLMService whose GetModelInfo runs `handler`. */
function fakeClient(options: ClientOptions, handler: (headers: Headers) => pb.ModelInfo) {
  const transport = createRouterTransport(
    ({ service }) =>
      service(pb.LLMService, {
        getModelInfo: (_req, ctx) => handler(ctx.requestHeader),
      }),
    { transport: { interceptors: clientInterceptors(options) } },
  );
  return new Client({ ...options, transport });
}

test("the API key goes out as authorization: Bearer, with the extra headers", async () => {
  const seen: (string | null)[] = [];
  const client = fakeClient({ apiKey: "s3cret", headers: { traceparent: "00-abc-def-01" } }, (h) => {
    seen.push(h.get("authorization"), h.get("traceparent"));
    return create(pb.ModelInfoSchema, { name: "fake" });
  });
  assert.equal((await client.modelInfo()).name, "fake");
  assert.deepEqual(seen, ["Bearer s3cret", "00-abc-def-01"]);
});

test("a wrong key is Unauthenticated and is not retried", async () => {
  let calls = 0;
  const client = fakeClient({ apiKey: "wrong" }, () => {
    calls++;
    throw new ConnectError("bad key", Code.Unauthenticated);
  });
  await assert.rejects(client.modelInfo(), Unauthenticated);
  assert.equal(calls, 1);
});

test("RESOURCE_EXHAUSTED is retried after the pushback; RetryInfo becomes retryAfterMs", async () => {
  let calls = 0;
  const started = Date.now();
  const client = fakeClient({ retries: { initialBackoffMs: 5000 } }, () => {
    if (++calls < 3) {
      const err = new ConnectError("queue full", Code.ResourceExhausted, { "grpc-retry-pushback-ms": "30" }, [
        { desc: RetryInfoSchema, value: { retryDelay: create(DurationSchema, { nanos: 30_000_000 }) } },
      ]);
      throw err;
    }
    return create(pb.ModelInfoSchema, { name: "after retries" });
  });
  assert.equal((await client.modelInfo()).name, "after retries");
  assert.equal(calls, 3);
  assert.ok(Date.now() - started < 2000, "waited the pushback, not the 5 s backoff");

  const noRetry = fakeClient({ retries: false }, () => {
    throw new ConnectError("queue full", Code.ResourceExhausted, {}, [
      { desc: RetryInfoSchema, value: { retryDelay: create(DurationSchema, { seconds: 2n, nanos: 500_000_000 }) } },
      { desc: BadRequestSchema, value: { fieldViolations: [{ field: "f", description: "d" }] } },
    ]);
  });
  const err = await noRetry.modelInfo().catch((e: unknown) => e);
  assert.ok(err instanceof ResourceExhausted);
  assert.equal(err.retryAfterMs, 2500);
  assert.deepEqual(err.fieldViolations, [{ field: "f", description: "d" }]);
});

test("sessionConfig maps flat options onto SessionConfig", () => {
  const config = sessionConfig({ temperature: 0, maxTokens: 12, stop: ["\n"], logprobs: true, drySequenceBreakers: ["x"],
    jsonSchema: { type: "object" }, sessionId: "s1" });
  assert.equal(config.sampling?.temperature, 0);
  assert.equal(config.stopping?.maxTokens, 12);
  assert.deepEqual(config.stopping?.stop, ["\n"]);
  assert.equal(config.output?.topLogprobs, 0);
  assert.deepEqual(config.sampling?.drySequenceBreakers?.values, ["x"]);
  assert.deepEqual(config.constraint?.kind, { case: "jsonSchema", value: '{"type":"object"}' });
  assert.equal(config.sessionId, "s1");
  assert.equal(sessionConfig({ model: "q8" }).model, "q8");
  assert.deepEqual(sessionConfig({ regex: "[a-z]+" }).constraint?.kind, { case: "regex", value: "[a-z]+" });
  assert.deepEqual(sessionConfig({ choice: ["a", "b"] }).constraint?.kind.value, create(StringListSchema, { values: ["a", "b"] }));
  assert.deepEqual(sessionConfig({ jsonObject: true }).constraint?.kind, { case: "jsonObject", value: true });
  assert.throws(() => sessionConfig({ regex: "x", choice: ["y"] }), /give one of/);
  assert.throws(() => sessionConfig({ temprature: 1 } as never), TypeError);
  const tools = sessionConfig({ tools: [{ name: "f", parameters: { type: "object" } }], toolChoice: "f",
    parallelToolCalls: true, jsonSchema: "{}", strict: true });
  assert.deepEqual(tools.tools.map((t) => [t.name, t.parameters]), [["f", '{"type":"object"}']]);
  assert.deepEqual([tools.toolChoice?.mode, tools.toolChoice?.functionName], [pb.ToolChoice_Mode.FUNCTION, "f"]);
  assert.equal(tools.parallelToolCalls, true);
  assert.equal(tools.constraint?.strict, true);
  assert.equal(sessionConfig({ toolChoice: "required" }).toolChoice?.mode, pb.ToolChoice_Mode.REQUIRED);
  assert.equal(parseGrpcTimeout("250m"), 250);
  assert.equal(parseGrpcTimeout("3S"), 3000);
});

// The Python SDK's keys for the same inputs (tests/unit/client/test_prefix_affinity.py checks
// them there): a call's head reaches the same replica from either language.
test("derived affinity keys match the Python SDK's", () => {
  const chat = [
    { role: "system", content: "Be brief." },
    { role: "user", content: "Héllo 👋" },
    { role: "assistant", content: "Hi" },
    { role: "user", content: "More" },
  ];
  const key = (prompt: Parameters<typeof makeInput>[0]) => prefixAffinityKey(makeInput(prompt));
  assert.equal(key(chat), "h-bdc19193a9d3d616");
  assert.equal(key("x".repeat(2000)), "h-49abd65bbf7f7e40");
  assert.equal(key("👋".repeat(1100)), "h-505f332a425ca867");
  assert.equal(key(Array.from({ length: 300 }, (_, i) => i)), "h-103d6b646b0bcb72");
  assert.equal(key(""), "");
});

/** A transport whose GenerateText records each call's affinity header in `seen`. */
function affinityRecorder() {
  const seen: (string | null)[] = [];
  const transport = createRouterTransport(({ service }) =>
    service(pb.LLMService, {
      generateText: (_req, ctx) => {
        seen.push(ctx.requestHeader.get("x-llmserve-affinity"));
        return create(pb.GenerateTextResponseSchema, {});
      },
    }),
  );
  return { seen, transport };
}

test("deriveAffinity sends the derived key; a caller's key wins; off by default", async () => {
  const { seen, transport } = affinityRecorder();
  const prompt = [{ role: "user", content: "Hi" }];
  await new Client({ transport, deriveAffinity: true }).generateText(prompt);
  await new Client({ transport, deriveAffinity: true, affinityKey: "tenant-7" }).generateText(prompt);
  await new Client({ transport }).generateText(prompt);
  assert.deepEqual(seen, [prefixAffinityKey(makeInput(prompt)), "tenant-7", null]);
});

test("a call under a LoRA adapter sends a-<adapter> unless a key or session id is set (as the Python SDK)", async () => {
  const { seen, transport } = affinityRecorder();
  const client = new Client({ transport, deriveAffinity: true });
  await client.generateText("Hi", { adapter: "support" });
  await client.generateText("Hi", { adapter: "support", sessionId: "s1" });
  await new Client({ transport, affinityKey: "tenant-7" }).generateText("Hi", { adapter: "support" });
  await client.generateText("Hi", { model: "q8" });
  assert.deepEqual(seen, ["a-support", "s1", "tenant-7", "m-q8"]);
  const config = sessionConfig({ adapter: "support", adapterScale: 0.5, continueFrom: "resp_1", store: true });
  assert.equal(config.adapter?.name, "support");
  assert.equal(config.adapter?.scale, 0.5);
  assert.equal(config.continueFrom, "resp_1");
  assert.equal(config.store, true);
  assert.equal(sessionConfig({ adapter: "x" }).adapter?.scale, undefined);
});
