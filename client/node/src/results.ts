/** One turn's responses gathered into a result (several samples when n > 1). @module */
import { create } from "@bufbuild/protobuf";
import {
  TurnEndSchema,
  type GenerateOnceResponse,
  type GenerateResponse,
  type TokenChunk,
  type TokenLogprob,
  type TurnEnd,
} from "./gen/llmserve/v1/llmserve_pb.js";

/**
 * A finished turn. `text`, `tokenIds`, `logprobs` and `turnEnd` are sample 0's;
 * `samples` holds every sample in index order (one unless the config asked for n > 1).
 * `logprobs`: one per token when the config set `topLogprobs`/`logprobs`;
 * `promptLogprobs`: the prompt tokens' when it set `promptLogprobs`.
 */
export interface GenerateResult {
  readonly text: string;
  readonly tokenIds: readonly number[];
  readonly turnEnd: TurnEnd;
  readonly logprobs: readonly TokenLogprob[];
  readonly promptLogprobs: readonly TokenLogprob[];
  readonly samples: readonly GenerateResult[];
}

/** A Generate or GenerateOnce response (the same fields). */
export type TurnResponse = GenerateResponse | GenerateOnceResponse;

/** Gathers one turn's responses (chunks, prompt logprobs, turn ends) into a GenerateResult. */
export async function collect(responses: AsyncIterable<TurnResponse> | Iterable<TurnResponse>): Promise<GenerateResult> {
  const chunks = new Map<number, TokenChunk[]>();
  const ends = new Map<number, TurnEnd>();
  const prompt: TokenLogprob[] = [];
  for await (const response of responses) {
    const event = response.event;
    if (event.case === "chunk") {
      const list = chunks.get(event.value.index) ?? [];
      list.push(event.value);
      chunks.set(event.value.index, list);
    } else if (event.case === "turnEnd") {
      ends.set(event.value.index, event.value);
    } else if (event.case === "promptLogprobs") {
      prompt.push(...event.value.tokens);
    }
  }
  const indices = [...new Set([0, ...chunks.keys(), ...ends.keys()])].sort((a, b) => a - b);
  const samples: GenerateResult[] = indices.map((i) => {
    const list = chunks.get(i) ?? [];
    return {
      text: list.map((c) => c.text).join(""),
      tokenIds: list.flatMap((c) => c.tokenIds),
      turnEnd: ends.get(i) ?? create(TurnEndSchema, { index: i }),
      logprobs: list.flatMap((c) => c.logprobs),
      promptLogprobs: prompt,
      samples: [],
    };
  });
  return { ...samples[0]!, samples };
}
