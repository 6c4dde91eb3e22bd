"""The executor thread's side of the engine: every module here runs on that thread only
(docs/architecture.md § Threads and who owns what)."""
