"""The named types one call touches, read from the code (ast only, nothing imported).

    python -m tools.call_path generate        # one plain gRPC Generate call
    python -m tools.call_path chat            # one plain POST /v1/chat/completions
    python -m tools.call_path chat --all-branches --why ChatResponder
    python -m tools.call_path --write-doc     # regenerate docs/architecture.md's sections
    python -m tools.call_path --check         # exit 1 when they are stale

What is counted (issue 40's way): every class, dataclass, enum, protocol, exception and
marker defined in `service/llmserve/service` that the call's code path constructs or calls
into. The second count leaves out markers (classes with no body), protocols and exceptions.
Types of other packages (grpc, aiohttp, the generated protobuf messages, numpy) are not
named types of the service and are never counted.

Where a call starts (found by name, so files may move):
- event loop, Generate: the `Generate` method of the one class that defines one (the servicer),
  its decorators included (`rpc_errors`);
- event loop, chat: the handler registered for `/v1/chat/completions` (`add_post(route, h)`);
  aiohttp middlewares and gRPC interceptors, which every request passes, are not walked;
- executor: the thread target (`threading.Thread(target=self._run)`) of the class that
  defines `step`: the step loop that handles the commands the call queues (`Open`,
  `AddInput`, `Close`) and runs the steps that decode its tokens. It is a second root:
  nothing on the loop side calls it. Work the loop hands to offload threads (`engine.offload`,
  `asyncio.to_thread`) is counted on the loop side, as the code that hands it over.
A type may be on both sides (`LoopSink`: made on the loop, `put` on the executor); the total
counts it once.

What the walk follows (walk.py, types.py, expressions.py):
- calls and references to project functions: a module function by its import, a method of
  `self`, of a parameter or local typed by its annotation, of an attribute typed by its class
  annotation or by what `__init__` (or any method) assigns to it (`self.table = SessionTable(...)`),
  of a value returned by an annotated function; a function passed as a value (a callback to a
  pool) counts as called; properties read are entered; `super().m()` goes to the base;
- containers: `dict[K, V]`, `list[T]`, `tuple[...]`, `deque`, iterators (`.values()`, `.get()`,
  `for`, subscripts, `zip`, `enumerate`), `Future[T]`/awaitables (`await`, `wrap_future`),
  `dataclasses.replace(x)` as x, TypeVar returns bound from the callables passed (`offload(fn)`);
- `with x as y` (a project `__enter__`), `except E as e`, walrus, tuple unpacking;
- a protocol's method (`Runner.decode`, `EventSink.put`) touches the protocol and goes to
  its implementers (deriving from it, or defining all its methods) that the call constructs,
  else to every implementer in the service (`LlamaRunner`, made at start-up, behind `Runner`);
- `if isinstance(x, C):` narrows x to C inside the branch.
Names in `isinstance` and `except` are tests, not uses: they touch nothing by themselves.

A *plain* call (the default; `--all-branches` reads everything, an upper bound):
- it fails nowhere: `raise` and `assert` statements and `except` bodies are not read;
- it takes an `if isinstance(x, C):` branch only when the call constructs a C somewhere
  (on either side; the walk repeats until that set stops growing), so the executor's
  `Embed` branch is not read for a Generate call, nor the loop's `_ReaderFailed` one;
- the features it does not use are left out by name, each with its reason, in plain.py
  (chat messages for Generate, tools, constraints, named sessions, speculation, logprobs,
  embeddings, large inputs for Generate, cancel, failures, draining). n > 1 and chat's
  streaming add no type of their own today: they are read, not left out.
  A name left out that no longer exists fails the tool: edit plain.py with the refactor.

Blind spots (the count can miss a type): untyped parameters and locals whose value comes from
an unannotated or external call; attributes assigned outside the class (`obj.x = C()` from
another class); objects reached only through `getattr`, `**kwargs` or a dict of handlers;
conditions other than `isinstance` (a plain call's `if tools is not None:` is settled by the
names in plain.py, not by the walk); dynamic dispatch to subclasses that override a method
of a concrete base. And it can over-count: every branch not settled by the rules above is
read, whether or not the plain call takes it.

Against the issue's figures (main at 725c320, counted by hand): Generate 59 (22 on the loop,
37 on the executor), chat 61. At 9e8e1de this tool reads Generate 57 (27 loop, 45 executor,
15 on both) and chat 61 (31 loop, 45 executor). The per-side split differs: 22 + 37 = 59 puts each
type on one side, while a type used on both is listed on both here; and the executor side
includes the model wing behind the protocols (`LlamaRunner`, `Sampler`, `BatchBuffer`,
`BatchArrays`, `Vocab`) and the per-step bookkeeping (`ExecutorSnapshot`, `SlotSnapshot`,
`StepProfile`, `ExecutorConfig`), while the plain call's exceptions and markers are not read.
"""
