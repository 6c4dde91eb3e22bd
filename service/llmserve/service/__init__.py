"""llmserve server: gRPC transport, batching executor, KV slot allocator, llama.cpp runner."""

__version__ = "0.1.0"
