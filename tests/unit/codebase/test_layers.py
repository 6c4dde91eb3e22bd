"""The house rules of the code base, checked from the source (ast, nothing imported):
wings import downward only (transport -> engine -> model, and http -> engine: each transport
wing through the engine's facade module engine/engine.py alone; everything may use the root's
config/domain/metrics/logs/tracing/turn_record; load_report, above the engine facade, is the
ORCA report both transport wings send), the two transport wings (gRPC's transport, OpenAI's http) never
import each other, engine, model and http never touch grpc or the generated stubs, the client never imports the service or the benchmarks, no import
circles, bench imports no test module, no file over 300 lines outside generated code (service, client,
bench, harness, tools, tests, and the example clients in Go, C++, Java and TypeScript), no function in the
service over 50 lines (its def line to its last)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SERVICE = ROOT / "service" / "llmserve" / "service"
CLIENT = ROOT / "client" / "llmserve" / "client"
BASE = {"config", "domain", "metrics", "logs", "tracing", "turn_record", "faults", "open_calls", "__init__"}
RANK = {"model": 0, "engine": 1, "transport": 2, "http": 2}
TRANSPORT_WINGS = ("transport", "http")


def _module(path: Path) -> str:
    top = ROOT / ("client" if path.is_relative_to(ROOT / "client") else "service")
    parts = path.relative_to(top).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Absolute names of every module the file imports (relative imports resolved)."""
    package = _module(path).split(".") if path.name == "__init__.py" else _module(path).split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            name = ".".join([*base, *([node.module] if node.module else [])])
            found.add(name)
            found.update(f"{name}.{alias.name}" for alias in node.names)
    return found


def _service_files() -> list[Path]:
    return sorted(SERVICE.rglob("*.py"))


def _wing(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 3 and parts[2] in RANK else None


def test_wings_import_downward_only() -> None:
    problems = []
    for path in _service_files():
        me = _module(path)
        my_wing = _wing(me)
        for name in _imports(path):
            if not name.startswith("llmserve.service."):
                if my_wing in ("engine", "model", "http") and (name.split(".")[0] == "grpc" or name.startswith("llmserve.v1")):
                    problems.append(f"{me} imports {name}")
                continue
            other = _wing(name)
            if my_wing is None:
                root_module = me.split(".")[2] if len(me.split(".")) > 2 else ""
                if root_module in BASE and other is not None and not name.endswith("__version__"):
                    problems.append(f"{me} (root) imports {name}")
            elif other is not None and RANK[other] > RANK[my_wing]:
                problems.append(f"{me} imports upward: {name}")
            elif my_wing in TRANSPORT_WINGS and other in TRANSPORT_WINGS and other != my_wing:
                problems.append(f"{me} imports the other transport wing: {name}")
            elif my_wing in TRANSPORT_WINGS and other == "model":
                problems.append(f"{me} reaches past the engine: {name}")
            elif my_wing in TRANSPORT_WINGS and other == "engine" and not name.startswith("llmserve.service.engine.engine"):
                problems.append(f"{me} reaches past the Engine facade (engine/engine.py): {name}")
    assert not problems, "\n".join(problems)


def test_no_import_circles() -> None:
    modules = {_module(p): p for p in _service_files()}
    graph = {m: {n for n in _imports(p) if n in modules and n != m} for m, p in modules.items()}
    state: dict[str, int] = {}

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for n in graph[m]:
            if state.get(n) == 1:
                raise AssertionError("import circle: " + " -> ".join([*stack[stack.index(n):], n]))
            if n not in state:
                visit(n, [*stack, n])
        state[m] = 2

    for m in graph:
        if m not in state:
            visit(m, [m])


def test_client_imports_neither_service_nor_bench() -> None:
    for path in sorted(CLIENT.rglob("*.py")):
        for name in _imports(path):
            assert not name.startswith(("llmserve.service", "bench", "tests", "harness")), f"{path.name} imports {name}"


def test_bench_imports_no_test_module() -> None:
    """What the benchmarks share with the tests (starting servers, an Envoy cluster, metrics)
    is the top-level harness/, not the tests' conftest or helpers."""
    for path in sorted((ROOT / "bench").rglob("*.py")):
        tree = ast.parse(path.read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level}
        assert not [n for n in names if n.split(".")[0] == "tests"], f"bench/{path.name} imports {sorted(names)}"


def test_the_fake_runner_needs_no_llama_cpp() -> None:
    """tests/unit/engine/fake_runner.py shares the real batch fill (model/batch_arrays.py): nothing it
    reaches in the service, package __init__ files included, may import llama_cpp."""
    modules = {_module(p): p for p in _service_files()}
    fake = ROOT / "tests" / "unit" / "engine" / "fake_runner.py"
    tree = ast.parse(fake.read_text())
    own = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    own |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not any(str(n).split(".")[0] == "llama_cpp" for n in own)
    todo = [n for n in own if n in modules]
    assert "llmserve.service.model.batch_arrays" in todo
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts)) if ".".join(parts[:i]) in modules]
        imported = _imports(modules[name])
        assert not any(n.split(".")[0] == "llama_cpp" for n in imported), f"{name} imports llama_cpp"
        todo += [n for n in imported if n in modules]


def _short_rule_sources() -> list[Path]:
    """Every hand-written source the 300-line rule covers: the service, the Python client,
    bench, harness, tools, the tests, the example clients (Go, C++, Java) and the TypeScript client
    with its tests and example; not the generated stubs (client/llmserve/v1, client/node/src/gen, gen/)."""
    examples = ROOT / "client" / "examples"
    node = ROOT / "client" / "node"
    return [
        *_service_files(),
        *CLIENT.rglob("*.py"),
        *(ROOT / "bench").rglob("*.py"),
        *(ROOT / "harness").rglob("*.py"),
        *(ROOT / "tools").rglob("*.py"),
        *(ROOT / "tests").rglob("*.py"),
        *(p for ext in ("go", "cc", "h", "java") for p in examples.rglob(f"*.{ext}")),
        *(p for folder in ("src", "test", "examples") for p in (node / folder).glob("*.ts")),
    ]


def test_files_stay_short() -> None:
    sources = _short_rule_sources()
    assert any(p.suffix == ".java" for p in sources) and any(p.suffix == ".ts" for p in sources)
    assert ROOT / "tests" / "unit" / "codebase" / "test_layers.py" in sources
    long = [f"{p.relative_to(ROOT)}: {len(p.read_text().splitlines())}" for p in sources
            if len(p.read_text().splitlines()) > 300]
    assert not long, long


MAX_FUNCTION_LINES = 50


def _long_functions(source: str) -> list[str]:
    """Functions (and methods) of `source` over MAX_FUNCTION_LINES, from the def line to the last."""
    spans = [(node.name, (node.end_lineno or node.lineno) - node.lineno + 1) for node in ast.walk(ast.parse(source))
             if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)]
    return [f"{name}: {num_lines}" for name, num_lines in spans if num_lines > MAX_FUNCTION_LINES]


def test_service_functions_stay_short() -> None:
    long = [f"{p.relative_to(ROOT)} {name}" for p in _service_files() for name in _long_functions(p.read_text())]
    assert not long, long
    assert _long_functions("def f():\n" + "    x = 1\n" * MAX_FUNCTION_LINES) == [f"f: {MAX_FUNCTION_LINES + 1}"]
