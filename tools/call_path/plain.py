"""What a *plain* call leaves out: the features it does not use, each a set of names.

A name is a class (neither touched nor entered anywhere on the call's path: the value
that would hold it is None, or the branch that makes it is not taken), a `Class.method`
or a module-level function (not entered; the receiver at the call site still counts).
What only those reach goes with them (no `GrammarCompiler` without `ConstraintCache`), so
each feature names as few things as it can, classes rather than methods: fewer names for a
refactor to rename. Every name must exist in the service: a rename fails the tool (and the
doc's test) here, so a count never widens unseen.
"""

from __future__ import annotations

FEATURES: dict[str, tuple[str, frozenset[str]]] = {
    "chat": ("the input is text or token ids, not chat messages", frozenset({"ChatMessage", "ChatTemplate"})),
    "tools": ("no tools: the plan is None, no reply is read for calls", frozenset({
        "ToolPlan", "Tool", "ToolChoice", "Reply", "ReplyReader", "NativeReader", "ToolCall", "ToolCallDelta"})),
    "constraint": ("no grammar, schema, regex or choice", frozenset({
        "ConstraintCache", "CompiledGrammar", "_Nullable", "Constraint", "Format"})),
    "named sessions": ("no session_id: nothing is loaded or saved", frozenset({
        "SessionStore", "SavedSession", "SessionTable._save"})),
    "stored turns": ("no continue_from, no store: no stored conversation is read or kept", frozenset({
        "ConversationStore", "StoredConversation", "StoredKV"})),
    "speculation": ("no draft tokens (as issue 40 counts a plain call)", frozenset({"DraftVerifier", "SeqSpeculation"})),
    "logprobs": ("no logprobs, no prompt logprobs", frozenset({"TokenLogprob", "PromptLogprobsEvent"})),
    "embeddings": ("not an embedding step", frozenset({"EmbedInput", "EmbedResult", "Embedder"})),
    "large input": ("under 16 KiB: tokenized and checked on the event loop, not the offload pool", frozenset({
        "OffloadPool"})),
    "cancel": ("the client never cancels a turn", frozenset({"SessionHandle.cancel"})),
    "failure": ("nothing fails (and no `raise`, `assert` or `except` body is read)", frozenset({"SessionFailed"})),
    "drain": ("the server is not shutting down", frozenset({"Drain"})),
    "several models": ("the call names no further model (--model NAME=PATH): the default model serves it", frozenset({
        "ServedModels._resident_now", "_Resident"})),
}

# Which features each call leaves out. Chat renders its messages on the offload pool, so
# "large input" stays in; HTTP has no named sessions and no cancel. n > 1 and streaming
# (chat's SSE branch is read too) add no type of their own today, so nothing names them.
CALLS: dict[str, tuple[str, ...]] = {
    "generate": ("chat", "tools", "constraint", "named sessions", "stored turns", "speculation", "logprobs", "embeddings",
                 "large input", "cancel", "failure", "drain", "several models"),
    "chat": ("tools", "constraint", "named sessions", "speculation", "logprobs", "embeddings", "failure", "drain",
             "several models"),
}

DESCRIPTIONS = {
    "generate": "one plain gRPC `Generate` call: one turn of text in, tokens out",
    "chat": "one plain `POST /v1/chat/completions`: one user message in, one choice out",
}


def pruned(call: str) -> set[str]:
    return set().union(*(FEATURES[f][1] for f in CALLS[call]))
