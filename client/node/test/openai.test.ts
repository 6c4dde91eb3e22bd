// The server's OpenAI HTTP API (--http-port) through the official `openai` npm package:
// LLMSERVE_OPENAI_BASE_URL (http://host:port/v1) of a server started with a chat template,
// --embeddings, -np >= 2 and --api-key LLMSERVE_API_KEY (tests/integration/clients/
// test_node_client.py starts one); skipped without.
import assert from "node:assert/strict";
import { before, test } from "node:test";
import OpenAI, { APIError } from "openai";
import type { ChatCompletionCreateParamsNonStreaming, ChatCompletionTool } from "openai/resources/chat/completions";

const baseURL = process.env.LLMSERVE_OPENAI_BASE_URL;
const apiKey = process.env.LLMSERVE_API_KEY;
const skip = baseURL && apiKey ? false : "LLMSERVE_OPENAI_BASE_URL / LLMSERVE_API_KEY not set";

const client = new OpenAI({ baseURL, apiKey: apiKey ?? "unset", maxRetries: 0, timeout: 120_000 });
const messages = [{ role: "user" as const, content: "Write one sentence about the sea." }];
let model = "";

before(async () => {
  if (!skip) model = (await client.models.list()).data[0]!.id;
});

/** What `call` threw, checked to be a `type` (one of the SDK's typed errors). */
async function refusal<E extends APIError>(call: Promise<unknown>, type: new (...args: never[]) => E): Promise<E> {
  const err = await call.then(() => assert.fail("the request was accepted"), (e: unknown) => e);
  assert.ok(err instanceof type, `${String(err)} is not a ${type.name}`);
  return err;
}

test("chat: whole, and streamed deltas that reassemble to it, with a usage chunk", { skip }, async () => {
  // ignore_eos (an extension) fixes the length; greedy, on a warm prefix cache like the whole reply.
  const body = { model, messages, temperature: 0, max_tokens: 12, ignore_eos: true } as ChatCompletionCreateParamsNonStreaming;
  await client.chat.completions.create(body); // warms the prefix cache: the compared calls run alike
  const whole = await client.chat.completions.create(body);
  const choice = whole.choices[0]!;
  assert.equal(choice.message.role, "assistant");
  assert.equal(choice.finish_reason, "length");
  assert.ok(choice.message.content && choice.message.content.length > 0);
  assert.equal(whole.usage?.completion_tokens, 12);
  assert.match(whole.id, /^chatcmpl-/);

  const stream = await client.chat.completions.create({ ...body, stream: true, stream_options: { include_usage: true } });
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  const text = chunks.map((c) => c.choices[0]?.delta.content ?? "").join("");
  assert.equal(text, choice.message.content);
  assert.equal(chunks[0]!.choices[0]!.delta.role, "assistant");
  const last = chunks.at(-1)!;
  assert.deepEqual(last.choices, []);
  assert.equal(last.usage?.completion_tokens, 12);
  assert.equal(last.usage?.total_tokens, last.usage!.prompt_tokens + 12);
  assert.equal(chunks.at(-2)!.choices[0]!.finish_reason, "length");
  assert.ok(chunks.slice(0, -1).every((c) => c.usage == null));
});

test("n=2: two choices, indexed, each with text", { skip }, async () => {
  const reply = await client.chat.completions.create({
    model, messages, n: 2, max_tokens: 8, seed: 3, ignore_eos: true,
  } as ChatCompletionCreateParamsNonStreaming);
  assert.deepEqual(reply.choices.map((c) => c.index), [0, 1]);
  assert.ok(reply.choices.every((c) => c.finish_reason === "length" && c.message.content));
  assert.equal(reply.usage?.completion_tokens, 16);
});

test("response_format json_schema: the reply parses and has the schema's keys", { skip }, async () => {
  const schema = {
    type: "object",
    properties: { name: { type: "string", maxLength: 30 }, age: { type: "integer" } },
    required: ["name", "age"],
    additionalProperties: false,
  };
  const reply = await client.chat.completions.create({
    model, temperature: 0, max_tokens: 120,
    messages: [{ role: "user", content: "Invent a person: give a name and an age." }],
    response_format: { type: "json_schema", json_schema: { name: "person", schema, strict: true } },
  });
  const choice = reply.choices[0]!;
  assert.equal(choice.finish_reason, "stop", choice.message.content ?? ""); // the grammar completed
  const person = JSON.parse(choice.message.content!);
  assert.deepEqual(Object.keys(person).sort(), ["age", "name"]);
  assert.equal(typeof person.name, "string");
  assert.ok(Number.isInteger(person.age));
});

test("tool_choice required: a call of the tool, its arguments JSON", { skip }, async () => {
  const tools: ChatCompletionTool[] = [{
    type: "function",
    function: {
      name: "get_weather",
      description: "Current weather for a city",
      parameters: { type: "object", properties: { city: { type: "string", maxLength: 40 } }, required: ["city"] },
    },
  }];
  const reply = await client.chat.completions.create({
    model, tools, tool_choice: "required", temperature: 0, max_tokens: 200,
    messages: [{ role: "user", content: "What is the weather in Oslo?" }],
  });
  const choice = reply.choices[0]!;
  assert.equal(choice.finish_reason, "tool_calls", JSON.stringify(choice));
  assert.equal(choice.message.tool_calls?.length, 1);
  const call = choice.message.tool_calls![0]!;
  assert.ok(call.type === "function" && call.id.startsWith("call_"));
  assert.equal(call.function.name, "get_weather");
  assert.equal(typeof JSON.parse(call.function.arguments).city, "string");
});

test("embeddings, float: one unit vector per input, in order", { skip }, async () => {
  const input = ["a red apple", "a green pear", "the third text"];
  const reply = await client.embeddings.create({ model, input, encoding_format: "float" });
  assert.deepEqual(reply.data.map((d) => d.index), [0, 1, 2]);
  const width = reply.data[0]!.embedding.length;
  assert.ok(width > 0);
  for (const { embedding } of reply.data) {
    assert.ok(Array.isArray(embedding) && embedding.length === width);
    const norm = Math.sqrt(embedding.reduce((s, x) => s + x * x, 0));
    assert.ok(Math.abs(norm - 1) < 1e-3, `norm ${norm}`);
  }
  assert.ok(reply.usage.prompt_tokens > 0);
});

test("typed errors: BadRequestError with param, NotFoundError, AuthenticationError", { skip }, async () => {
  const bad = await refusal(client.chat.completions.create({ model, messages, temperature: -1 }), OpenAI.BadRequestError);
  assert.equal(bad.status, 400);
  assert.equal(bad.param, "temperature");
  assert.equal(bad.type, "invalid_request_error");
  const missing = await refusal(client.chat.completions.create({ model: "gpt-4o", messages }), OpenAI.NotFoundError);
  assert.equal(missing.code, "model_not_found");
  assert.equal(missing.param, "model");
  const wrong = new OpenAI({ baseURL, apiKey: "wrong-key", maxRetries: 0, timeout: 30_000 });
  const denied = await refusal(wrong.chat.completions.create({ model, messages, max_tokens: 2 }), OpenAI.AuthenticationError);
  assert.equal(denied.code, "invalid_api_key");
  await refusal(wrong.models.list(), OpenAI.AuthenticationError);
});
