"""Where a call starts, found by name in the tree, and the walk of both its sides."""

from __future__ import annotations

import ast
from dataclasses import dataclass

from .index import ClassInfo, Func, Index, ModuleInfo
from .types import Types
from .walk import Side, Walk

CHAT_ROUTE = "/v1/chat/completions"
Root = tuple[ModuleInfo, ClassInfo | None, Func]


def generate_root(index: Index) -> Root:
    """The gRPC servicer's handler: the one class that defines a `Generate` method."""
    found = [c for c in index.all_classes if "Generate" in c.methods]
    if len(found) != 1:
        raise LookupError(f"expected one class with a Generate method, found {[c.qualname for c in found]}")
    return found[0].module, found[0], found[0].methods["Generate"]


def chat_root(index: Index) -> Root:
    """The aiohttp handler registered for /v1/chat/completions: the expression after the route
    in a call or a tuple (`add_post(route, h)`, `add_route("POST", route, h)`, `web.post(route, h)`,
    `(route, h)`), or the route's value in a dict."""
    found = []
    for module in index.modules.values():
        for owner, func in _functions(module):
            for node in ast.walk(func):
                for expr in _after_route(node):
                    handler = _handler(index, module, owner, expr)
                    if handler is not None:
                        found.append(handler)
    if len(found) != 1:
        raise LookupError(f"expected one handler for {CHAT_ROUTE}, found {len(found)}")
    return found[0]


def _after_route(node: ast.AST) -> list[ast.expr]:
    def is_route(e: ast.expr | None) -> bool:
        return isinstance(e, ast.Constant) and e.value == CHAT_ROUTE

    if isinstance(node, ast.Dict):
        return [v for k, v in zip(node.keys, node.values) if is_route(k)]
    items = node.args if isinstance(node, ast.Call) else node.elts if isinstance(node, (ast.Tuple, ast.List)) else []
    return [items[i + 1] for i, e in enumerate(items[:-1]) if is_route(e)]


def executor_root(index: Index) -> Root:
    """The executor's step loop: the thread target (`threading.Thread(target=self.X)`) of the
    class that defines `step`."""
    found = []
    for cls in index.all_classes:
        if "step" not in cls.methods:
            continue
        for node in ast.walk(cls.node):
            if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("Thread"):
                for kw in node.keywords:
                    target = kw.value
                    if (kw.arg == "target" and isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                            and target.value.id == "self" and target.attr in cls.methods):
                        found.append((cls.module, cls, cls.methods[target.attr]))
    if len(found) != 1:
        raise LookupError(f"expected one executor thread (a class with step() and a Thread target), found {len(found)}")
    return found[0]


def _functions(module: ModuleInfo) -> list[tuple[ClassInfo | None, Func]]:
    return [(None, f) for f in module.functions.values()] + [
        (c, f) for c in module.classes.values() for f in c.methods.values()]


def _handler(index: Index, module: ModuleInfo, owner: ClassInfo | None, expr: ast.expr) -> Root | None:
    if (isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and expr.value.id == "self"
            and owner is not None and expr.attr in owner.methods):
        return module, owner, owner.methods[expr.attr]
    target = index.resolve_expr(module, expr)
    if isinstance(target, tuple):
        return target[0], None, target[1]
    return None


@dataclass
class CallPath:
    """The classes a call touches, per side: `loop` (the event loop, with the work it hands to
    offload threads) and `executor` (the executor thread's loop)."""

    name: str
    loop: Side
    executor: Side
    index: Index

    def classes(self, side: Side) -> list[ClassInfo]:
        by_qual = {c.qualname: c for c in self.index.all_classes}
        return sorted((by_qual[q] for q in side.touched), key=lambda c: (c.path, c.name))

    @property
    def total(self) -> int:
        return len(set(self.loop.touched) | set(self.executor.touched))


def walk_call(index: Index, name: str, root: Root, loop_pruned: set[str], executor_pruned: set[str],
              plain: bool = True) -> CallPath:
    """Both sides of the call. With `plain`, the walk repeats until the classes the call
    constructs stop growing (an isinstance branch is read once its class is made somewhere)."""
    _check_pruned(index, loop_pruned | executor_pruned)
    types = Types(index)
    live: set[str] = set()
    for _ in range(20):
        loop, executor = _walk_once(types, root, loop_pruned, executor_pruned, plain, live)
        made = loop.constructed | executor.constructed
        if made <= live:
            break
        live |= made
    return CallPath(name, loop, executor, index)


def _walk_once(types: Types, root: Root, loop_pruned: set[str], executor_pruned: set[str], plain: bool,
               live: set[str]) -> tuple[Side, Side]:
    loop_walk, executor_walk = Walk(types, loop_pruned, plain, live), Walk(types, executor_pruned, plain, live)
    exec_root = executor_root(types.index)
    loop, executor = Side("event loop", _name(root)), Side("executor", _name(exec_root))
    loop_walk.enter(loop, *root)
    loop_walk.run(loop)
    executor_walk.enter(executor, *exec_root)
    executor_walk.run(executor)
    for _ in range(20):  # protocol calls go to the classes constructed, until nothing new
        constructed = loop.constructed | executor.constructed
        loop.constructed, executor.constructed = set(constructed), set(constructed)
        if not (loop_walk.dispatch([loop]) | executor_walk.dispatch([executor])):
            break
    return loop, executor


def _name(root: Root) -> str:
    module, cls, func = root
    return f"`{module.path}` `{cls.name + '.' if cls else ''}{func.name}`"


def _check_pruned(index: Index, pruned: set[str]) -> None:
    """Every pruned name exists: a rename must be seen here, not silently widen the path."""
    known = {c.name for c in index.all_classes} | {f"{c.name}.{m}" for c in index.all_classes for m in c.methods}
    known |= {f for m in index.modules.values() for f in m.functions}
    missing = sorted(pruned - known)
    if missing:
        raise LookupError(f"pruned names not in the service (renamed or gone? edit tools/call_path/plain.py): {missing}")
