// llmserve client for Node.js: @grpc/grpc-js with the service loaded from proto/ by
// @grpc/proto-loader (no generated code to keep in sync).
'use strict';

const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const PROTO = path.resolve(__dirname, '..', '..', 'proto', 'llmserve', 'v1', 'llmserve.proto');
const definition = protoLoader.loadSync(PROTO, {
  keepCase: true, longs: Number, enums: String, defaults: true, oneofs: true,
});
const { LLMService } = grpc.loadPackageDefinition(definition).llmserve.v1;

class Client {
  constructor(address = '127.0.0.1:50051', { credentials = grpc.credentials.createInsecure(), apiKey } = {}) {
    this.stub = new LLMService(address, credentials);
    this.metadata = new grpc.Metadata();
    if (apiKey) this.metadata.set('authorization', `Bearer ${apiKey}`);
  }

  // One turn: calls onChunk(text, tokenIds) as tokens stream in; resolves to
  // { text, tokenIds, turnEnd }.
  generate(prompt, { maxTokens, temperature, seed, onChunk, deadlineMs = 60000 } = {}) {
    const sampling = {};
    if (temperature !== undefined) sampling.temperature = temperature;
    if (seed !== undefined) sampling.seed = seed;
    const stopping = maxTokens !== undefined ? { max_tokens: maxTokens } : {};
    const input = typeof prompt === 'string' ? { text: prompt } : { tokens: { ids: prompt } };
    const call = this.stub.Generate(this.metadata, { deadline: Date.now() + deadlineMs });
    return new Promise((resolve, reject) => {
      const text = [];
      const tokenIds = [];
      let turnEnd = null;
      call.on('data', (response) => {
        if (response.chunk) {
          text.push(response.chunk.text);
          tokenIds.push(...response.chunk.token_ids);
          if (onChunk) onChunk(response.chunk.text, response.chunk.token_ids);
        } else if (response.turn_end) {
          turnEnd = response.turn_end;
        }
      });
      call.on('error', reject);
      call.on('end', () => resolve({ text: text.join(''), tokenIds, turnEnd }));
      call.write({ config: { sampling, stopping }, input, end_of_turn: true });
      call.end();
    });
  }

  // Embeds texts in one stream; resolves to the vectors in input order.
  embed(texts, { batchSize = 32, deadlineMs = 60000 } = {}) {
    const call = this.stub.Embed(this.metadata, { deadline: Date.now() + deadlineMs });
    return new Promise((resolve, reject) => {
      const vectors = [];
      call.on('data', (response) => { vectors[response.index] = response.embedding; });
      call.on('error', reject);
      call.on('end', () => resolve(vectors));
      for (let i = 0; i < texts.length; i += batchSize) {
        call.write({ inputs: texts.slice(i, i + batchSize).map((text) => ({ text })) });
      }
      call.end();
    });
  }

  modelInfo() {
    return new Promise((resolve, reject) => {
      this.stub.GetModelInfo({}, this.metadata, (err, info) => (err ? reject(err) : resolve(info)));
    });
  }

  close() {
    this.stub.close();
  }
}

module.exports = { Client, grpc };
