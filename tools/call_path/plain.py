"""What a *plain* call leaves out: the features it does not use, each a set of names.

A name is a class (neither touched nor entered anywhere on the call's path: the value
that would hold it is None, or the branch that makes it is not taken), a `Class.method`
or a module-level function (not entered; the receiver at the call site still counts).
Every name must exist in the service: a rename fails the tool (and the doc's test) here.
"""

from __future__ import annotations

FEATURES: dict[str, tuple[str, frozenset[str]]] = {
    "chat": ("the input is text or token ids, not chat messages", frozenset({
        "SessionHandle.add_messages", "Engine._render_offloaded", "ChatMessage", "ChatTemplate"})),
    "tools": ("no tools: the plan is None, no reply is read for calls", frozenset({
        "ToolPlan", "Tool", "ToolChoice", "Reply", "ReplyReader", "ToolCall", "ToolCallDelta"})),
    "constraint": ("no grammar, schema, regex or choice", frozenset({
        "Engine.compile_constraint", "compile_constraint", "ConstraintCache", "GrammarCompiler", "CompiledGrammar",
        "_Nullable", "Constraint", "Format"})),
    "named sessions": ("no session_id: nothing is loaded or saved", frozenset({
        "SessionStore", "SavedSession", "Engine.load_session", "SessionTable._save"})),
    "speculation": ("no draft tokens (as issue 40 counts a plain call)", frozenset({
        "DraftVerifier", "SeqSpeculation", "NgramIndex", "DraftOdds"})),
    "n > 1": ("one sample: nothing is forked", frozenset({"Session.fork_samples", "Sample.fork", "SessionTable._fork"})),
    "logprobs": ("no logprobs, no prompt logprobs", frozenset({
        "TokenLogprob", "PromptLogprobsEvent", "score_prompt_chunk"})),
    "embeddings": ("not an embedding step", frozenset({
        "Executor._run_embeddings", "EmbedInput", "EmbedResult", "Embedder"})),
    "large input": ("under 16 KiB: tokenized and checked on the event loop, not the offload pool", frozenset({
        "OffloadPool", "_Job"})),
    "cancel": ("the client never cancels a turn", frozenset({"SessionHandle.cancel"})),
    "failure": ("nothing fails (and no `raise`, `assert` or `except` body is read)", frozenset({
        "SessionFailed", "SessionTable.fail", "Executor._shutdown"})),
    "drain": ("the server is not shutting down", frozenset({"Drain"})),
    "streaming": ("answered whole, not as server-sent events", frozenset({"ChatResponder.stream"})),
}

# Which features each call leaves out. Chat renders its messages (on the offload pool, so
# "large input" stays in); gRPC streams by nature, HTTP has no named sessions or cancel.
CALLS: dict[str, tuple[str, ...]] = {
    "generate": ("chat", "tools", "constraint", "named sessions", "speculation", "n > 1", "logprobs",
                 "embeddings", "large input", "cancel", "failure", "drain"),
    "chat": ("tools", "constraint", "named sessions", "speculation", "n > 1", "logprobs", "embeddings",
             "failure", "drain", "streaming"),
}

DESCRIPTIONS = {
    "generate": "one plain gRPC `Generate` call: one turn of text in, tokens out",
    "chat": "one plain non-streamed `POST /v1/chat/completions`: one user message in, one choice out",
}


def pruned(call: str) -> set[str]:
    return set().union(*(FEATURES[f][1] for f in CALLS[call]))
