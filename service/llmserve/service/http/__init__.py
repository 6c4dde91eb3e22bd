"""The OpenAI-compatible HTTP wing: `/v1/chat/completions`, `/v1/completions`, `/v1/embeddings`,
`/v1/models`, `/health` (aiohttp).

A second transport beside `transport/` (gRPC), on the same event loop and the same
`Engine`: it translates JSON to the engine's domain values and events back to OpenAI's
shapes, nothing more. It reaches the engine only through `engine/engine.py`, never
imports grpc or `transport/`, and `transport/` never imports it (tests/unit/codebase/test_layers.py).
The process (`process.py`) runs it as a `Surface`, a peer of gRPC's.
"""
