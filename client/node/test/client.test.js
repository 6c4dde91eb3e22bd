// Runs against a live server: LLMSERVE_ADDRESS (set by tests/integration/test_node_client.py).
'use strict';

const test = require('node:test');
const assert = require('node:assert');
const { Client } = require('..');

const address = process.env.LLMSERVE_ADDRESS || '127.0.0.1:50051';

test('streams a Generate turn', async () => {
  const client = new Client(address);
  const chunks = [];
  const result = await client.generate('The capital of France is', {
    maxTokens: 8, temperature: 0, onChunk: (text) => chunks.push(text),
  });
  client.close();
  assert.strictEqual(result.turnEnd.finish_reason, 'FINISH_REASON_LENGTH');
  assert.strictEqual(result.turnEnd.usage.completion_tokens, 8);
  assert.strictEqual(result.tokenIds.length, 8);
  assert.strictEqual(chunks.join(''), result.text);
  assert.ok(result.text.length > 0);
});

test('embeds a batch in order', async () => {
  const client = new Client(address);
  const texts = Array.from({ length: 40 }, (_, i) => `Sentence number ${i} for the Node client.`);
  const vectors = await client.embed(texts, { batchSize: 16 });
  const info = await client.modelInfo();
  client.close();
  assert.strictEqual(vectors.length, 40);
  for (const v of vectors) {
    assert.strictEqual(v.length, info.n_embd);
    const norm = Math.sqrt(v.reduce((s, x) => s + x * x, 0));
    assert.ok(Math.abs(norm - 1) < 1e-3);
  }
});

test('bad input is INVALID_ARGUMENT', async () => {
  const client = new Client(address);
  await assert.rejects(client.generate([2, -1], { maxTokens: 2 }), (err) => err.code === 3);
  client.close();
});
