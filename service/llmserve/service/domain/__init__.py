"""Domain types shared by the transport, the engine and the model wings, by concern:
`errors`, `model_meta`, `requests`, `events`, `snapshots`.

Everything here is a frozen dataclass, an enum, a protocol or an exception: these
values cross from the event-loop thread to the executor thread and back, so nobody
may mutate them. Nothing here imports grpc or llama_cpp.
"""
