/**
 * The client scenario of tests/client_scenario.py, with this package: reads the server
 * address from LLMSERVE_ADDRESS and prints one JSON object per line (model_info, turn,
 * turn, cancel, embed, bad_request); exits 0 when every step ran.
 *
 *     LLMSERVE_ADDRESS=127.0.0.1:50051 node dist/examples/scenario.js
 */
import { Client, InvalidArgument, LLMServeError, pb } from "../src/index.js";

const TURN_1 = "The three primary colours are";
const TURN_2 = " And the three secondary colours are";
const CANCEL_PROMPT = "Write a very long story about a lighthouse keeper.";
const EMBED_TEXTS = ["a red apple", "a green pear", "the stock market fell today"];

/** The enum value's proto name, e.g. "FINISH_REASON_LENGTH". */
function finishReason(value: pb.FinishReason): string {
  return pb.FinishReasonSchema.values.find((v) => v.number === value)?.name ?? String(value);
}

function print(step: Record<string, unknown>): void {
  process.stdout.write(JSON.stringify(step) + "\n");
}

async function main(): Promise<void> {
  const client = new Client({ address: process.env.LLMSERVE_ADDRESS ?? "127.0.0.1:50051", timeoutMs: 120_000 });
  try {
    const info = await client.modelInfo({ timeoutMs: 30_000 });
    print({ step: "model_info", name: info.name, n_ctx: info.nCtx, embedding_dim: info.embeddingModel?.nEmbd ?? 0 });

    // One Generate stream, two turns; the second prefills only its own tokens.
    const session = client.session({ temperature: 0, maxTokens: 12 });
    for (const [turn, prompt] of [[1, TURN_1], [2, TURN_2]] as const) {
      let chunks = 0;
      let text = "";
      for await (const chunk of session.send(prompt)) {
        chunks++;
        text += chunk.text;
      }
      const end = session.turnEnd!;
      print({
        step: "turn", turn, chunks, text, finish_reason: finishReason(end.finishReason),
        prompt_tokens: end.usage?.promptTokens ?? 0, cached_tokens: end.usage?.cachedTokens ?? 0,
        completion_tokens: end.usage?.completionTokens ?? 0,
      });
    }
    await session.close(); // half-close; the stream ends OK

    // In-band cancel after the first chunk.
    const long = client.session({ maxTokens: 400, ignoreEos: true });
    let cancelled = false;
    for await (const _chunk of long.send(CANCEL_PROMPT)) {
      if (!cancelled) {
        long.cancel();
        cancelled = true;
      }
    }
    const end = long.turnEnd!;
    await long.close();
    print({ step: "cancel", finish_reason: finishReason(end.finishReason), completion_tokens: end.usage?.completionTokens ?? 0 });

    // One Embed stream, one message with the three texts.
    const embeddings = [];
    for await (const e of client.embed(EMBED_TEXTS, { batchSize: EMBED_TEXTS.length })) embeddings.push(e);
    print({ step: "embed", count: embeddings.length, dims: embeddings.map((e) => e.vector.length), indices: embeddings.map((e) => e.index) });

    // max_tokens -1: INVALID_ARGUMENT with a google.rpc.BadRequest in the status details.
    try {
      await client.session({ maxTokens: -1 }).ask("Hi", { timeoutMs: 30_000 });
      throw new Error("max_tokens -1 was accepted");
    } catch (err) {
      if (!(err instanceof InvalidArgument)) throw err;
      const violation = err.fieldViolations[0];
      print({ step: "bad_request", code: err.codeName, field: violation?.field ?? "", description: violation?.description ?? "" });
    }
  } finally {
    client.close();
  }
}

main().catch((err: unknown) => {
  const detail = err instanceof LLMServeError ? `${err.message} ${JSON.stringify(err.fieldViolations)}` : String(err);
  process.stderr.write(`scenario failed: ${detail}\n`);
  process.exit(1);
});
