// Prefix affinity without a key (`deriveAffinity: true`): a one-shot Generate call with
// neither an `affinityKey` nor a `sessionId` is sent with a key derived from the stable
// head of its input, so that a balancer hashing `x-llmserve-affinity` (the project's
// Envoy config: Maglev with bounded load) sends calls sharing that head to the replica
// that cached it. The same keys as the Python SDK's (client/llmserve/client/affinity.py):
// chat: the system messages and the first user message; text: its first 1,024
// characters (code points); token ids: the first 256. "h-" + 16 hex digits of SHA-256.
import { createHash } from "node:crypto";
import type { Input } from "./gen/llmserve/v1/llmserve_pb.js";

export const HEAD_CHARS = 1024;
export const HEAD_TOKENS = 256;

function headOf(input: Input): Buffer {
  const kind = input.kind;
  if (kind.case === "messages") {
    const parts: Buffer[] = [];
    for (const message of kind.value.messages) {
      parts.push(Buffer.from(`${message.role}\n${message.content}`, "utf8"));
      if (message.role === "user") break;
    }
    return Buffer.concat(parts.flatMap((part, i) => (i ? [Buffer.from([0]), part] : [part])));
  }
  if (kind.case === "tokens") {
    const ids = kind.value.ids.slice(0, HEAD_TOKENS);
    return ids.length ? Buffer.from(`tokens:${ids.join(",")}`, "utf8") : Buffer.alloc(0);
  }
  const text = kind.case === "text" ? kind.value : "";
  return Buffer.from(Array.from(text).slice(0, HEAD_CHARS).join(""), "utf8");
}

/** The key for `input`'s head ("" for an empty input). */
export function prefixAffinityKey(input: Input): string {
  const head = headOf(input);
  return head.length ? `h-${createHash("sha256").update(head).digest("hex").slice(0, 16)}` : "";
}
