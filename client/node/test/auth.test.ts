// The API key against a server started with --api-key: LLMSERVE_API_KEY_ADDRESS and
// LLMSERVE_API_KEY (tests/integration/clients/test_node_client.py starts one); skipped without.
import assert from "node:assert/strict";
import { test } from "node:test";
import { Client, Unauthenticated } from "../src/index.js";

const address = process.env.LLMSERVE_API_KEY_ADDRESS;
const key = process.env.LLMSERVE_API_KEY;
const skip = address && key ? false : "LLMSERVE_API_KEY_ADDRESS / LLMSERVE_API_KEY not set";

test("with the right key the call succeeds; without or wrong it is Unauthenticated", { skip }, async () => {
  const good = new Client({ address, apiKey: key, timeoutMs: 30_000 });
  assert.ok((await good.modelInfo()).name.length > 0);
  assert.deepEqual(await good.tokenize("hi", { addSpecial: false }), await good.tokenize("hi", { addSpecial: false }));
  for (const apiKey of [undefined, "wrong-key"]) {
    const bad = new Client({ address, apiKey, timeoutMs: 30_000 });
    await assert.rejects(bad.modelInfo(), Unauthenticated);
    bad.close();
  }
  good.close();
});
