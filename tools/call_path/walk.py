"""The walk: from a root function through every project function its code references.

The visitor reads a function's body (annotations skipped, nested functions and lambdas
read as part of it, `if isinstance(x, C):` narrowing x to C in its branch) and records:
- a project class *touched*: constructed (`C(...)`, its `__init__`/`__post_init__` walked),
  named in an expression (`isinstance`, `except`, `FinishReason.STOP`, passed as a value),
  or the receiver of an attribute read, write or method call (`x.m()` with x typed C);
  a method found on a base class touches the base too;
- a project function or method *reached*: called or referenced (a callback handed to a pool
  or a thread runs as part of the call), a property read, a decorator of a reached function.
A method called on a protocol (`Runner`, `EventSink`) touches the protocol and is kept as a
pending dispatch, resolved by `Walk.dispatch` once both sides are walked.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from .expressions import attribute
from .index import ClassInfo, Func, ModuleInfo
from .types import Scope, Types


@dataclass
class Side:
    """One thread's part of the call: the classes it touches and the functions it runs."""

    name: str
    root: str = ""  # "module:Class.method" where the walk starts
    touched: dict[str, set[str]] = field(default_factory=dict)  # class qualname -> how
    reached: set[str] = field(default_factory=set)  # "module:Class.func"
    constructed: set[str] = field(default_factory=set)
    pending: set[tuple[str, str]] = field(default_factory=set)  # (protocol qualname, method)
    where: dict[str, set[str]] = field(default_factory=dict)  # class qualname -> the functions touching it
    todo: list[tuple[ModuleInfo, ClassInfo | None, Func]] = field(default_factory=list)


class Walk:
    def __init__(self, types: Types, pruned: set[str], plain: bool = True, live: set[str] | None = None) -> None:
        """`pruned`: "Class", "Class.method" or "function" names the walk neither touches nor enters.
        `plain`: the call fails nowhere (no `raise`, `assert` or `except` body is read) and takes
        an `if isinstance(x, C):` branch only when C is in `live` (the classes the call constructs)."""
        self.types = types
        self.index = types.index
        self.pruned = pruned
        self.plain = plain
        self.live = live if live is not None else set()
        self.current = "(dispatch)"  # the function being read, for `--why`

    def is_pruned(self, cls: ClassInfo | None, name: str | None = None) -> bool:
        if cls is not None and (cls.name in self.pruned or (name and f"{cls.name}.{name}" in self.pruned)):
            return True
        return cls is None and name in self.pruned

    def touch(self, side: Side, cls: ClassInfo, how: str) -> bool:
        if self.is_pruned(cls):
            return False
        side.touched.setdefault(cls.qualname, set()).add(how)
        side.where.setdefault(cls.qualname, set()).add(self.current)
        return True

    def enter(self, side: Side, module: ModuleInfo, cls: ClassInfo | None, func: Func) -> None:
        key = f"{module.name}:{cls.name + '.' if cls else ''}{func.name}"
        if key in side.reached or self.is_pruned(cls, func.name):
            return
        side.reached.add(key)
        side.todo.append((module, cls, func))

    def run(self, side: Side) -> None:
        while side.todo:
            module, cls, func = side.todo.pop()
            self.current = f"{module.name}:{cls.name + '.' if cls else ''}{func.name}"
            scope = self.types.scope(module, cls, func)
            visitor = _Visitor(self, side, scope)
            for decorator in func.decorator_list:
                visitor.visit(decorator)
            for statement in func.body:
                visitor.visit(statement)

    def dispatch(self, sides: list[Side]) -> bool:
        """Each pending protocol call goes to the protocol's implementers that the call
        constructs (on either side), else to every implementer in the service; True if new work."""
        constructed = set().union(*(s.constructed for s in sides))
        new = False
        for side in sides:
            for proto_qual, method in sorted(side.pending):
                impls = self.implementers(self.types.by_qual[proto_qual])
                chosen = [c for c in impls if c.qualname in constructed] or impls
                for cls in chosen:
                    found = self.index.find_method(cls, method)
                    self.current = f"(dispatch {proto_qual.split('.')[-1]}.{method})"
                    if found and self.touch(side, cls, f"implements {proto_qual.split('.')[-1]}"):
                        before = len(side.reached)
                        self.enter(side, found[0].module, found[0], found[1])
                        new |= len(side.reached) > before
            for side_ in sides:
                self.run(side_)
        return new

    def implementers(self, proto: ClassInfo) -> list[ClassInfo]:
        """Project classes deriving from `proto`, or defining all its methods (structural)."""
        wanted = {n for n in proto.methods if not n.startswith("__")}
        found = []
        for cls in self.index.all_classes:
            if cls is proto or self.index.kind(cls) == "protocol":
                continue
            own = {n for c in self.index.mro(cls) for n in c.methods}
            if proto in self.index.mro(cls) or (wanted and wanted <= own):
                found.append(cls)
        return found


class _Visitor(ast.NodeVisitor):
    def __init__(self, walk: Walk, side: Side, scope: Scope) -> None:
        self.walk, self.side, self.scope, self.types = walk, side, scope, walk.types

    # annotations are not uses
    def visit_arg(self, node: ast.arg) -> None:
        return

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for d in node.decorator_list:
            self.visit(d)
        for default in [*node.args.defaults, *(d for d in node.args.kw_defaults if d is not None)]:
            self.visit(default)
        for statement in node.body:
            self.visit(statement)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self.visit(node.target)
        if node.value is not None:
            self.visit(node.value)

    def visit_Raise(self, node: ast.Raise) -> None:
        if not self.walk.plain:
            self.generic_visit(node)

    visit_Assert = visit_Raise

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if not self.walk.plain:
            for statement in node.body:
                self.visit(statement)

    def visit_If(self, node: ast.If) -> None:
        self.visit(node.test)
        narrowed = self._narrowed(node.test)
        if self.walk.plain and narrowed and not any(a[1] in self.walk.live for t in narrowed.values() for a in t):
            for statement in node.orelse:  # an isinstance branch for a class this call never makes
                self.visit(statement)
            return
        saved = self.scope.env
        self.scope.env = {**saved, **narrowed}
        for statement in node.body:
            self.visit(statement)
        self.scope.env = saved
        for statement in node.orelse:
            self.visit(statement)

    def _narrowed(self, test: ast.expr) -> dict[str, frozenset]:
        tests = test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else [test]
        env = {}
        for t in tests:
            if (isinstance(t, ast.Call) and isinstance(t.func, ast.Name) and t.func.id == "isinstance"
                    and len(t.args) == 2 and isinstance(t.args[0], ast.Name)):
                named = t.args[1].elts if isinstance(t.args[1], ast.Tuple) else [t.args[1]]
                kinds = [self.types.instances(self.types.expr(n, self.scope)) for n in named]
                if all(kinds):  # all project classes (`isinstance(x, (str, C))` may match a str)
                    env[t.args[0].id] = frozenset().union(*kinds)
        return env

    def visit_Call(self, node: ast.Call) -> None:
        if isinstance(node.func, ast.Name) and node.func.id in ("isinstance", "issubclass") and len(node.args) == 2:
            self.visit(node.args[0])  # a class tested for is not used: the branch it guards tells
            return
        self._call(node)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in self.scope.env:
            return
        self._reference(self.types.expr(node, self.scope), "named")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self.visit(node.value)
        value = self.types.expr(node.value, self.scope)
        for atom in value:
            if atom[0] in ("inst", "cls"):
                cls = self.types.by_qual[atom[1]]
                self.walk.touch(self.side, cls, "uses")
                self._property(cls, node.attr)
                if self.walk.index.kind(cls) == "protocol" and node.attr in cls.methods:
                    self.side.pending.add((cls.qualname, node.attr))
        modules = frozenset(a for a in value if a[0] == "mod")
        self._reference(attribute(self.types, modules, node.attr), "named")  # `validation.session_params`
        self._reference(frozenset(a for a in attribute(self.types, value, node.attr) if a[0] == "meth"), "calls")

    def _property(self, cls: ClassInfo, name: str) -> None:
        found = self.walk.index.find_method(cls, name)
        if found is not None:
            owner, func = found
            if owner is not cls:
                self.walk.touch(self.side, owner, "base of " + cls.name)
            if any("property" in ast.unparse(d) for d in func.decorator_list):
                self.walk.enter(self.side, owner.module, owner, func)

    def _call(self, node: ast.Call) -> None:
        self.generic_visit(node)
        func = self.types.expr(node.func, self.scope)
        for atom in func:
            if atom[0] == "cls":
                cls = self.types.by_qual[atom[1]]
                if self.walk.touch(self.side, cls, "constructs"):
                    self.side.constructed.add(cls.qualname)
                    for init in ("__init__", "__post_init__"):
                        found = self.walk.index.find_method(cls, init)
                        if found:
                            self.walk.touch(self.side, found[0], "constructs")
                            self.walk.enter(self.side, found[0].module, found[0], found[1])
        if isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Call):
            inner = self.types.expr(node.func.value, self.scope)
            for atom in inner:
                if atom[0] == "super":
                    for base in self.walk.index.bases(self.types.by_qual[atom[1]]):
                        found = self.walk.index.find_method(base, node.func.attr)
                        if found and self.walk.touch(self.side, found[0], "base"):
                            self.walk.enter(self.side, found[0].module, found[0], found[1])

    def _reference(self, types: frozenset, how: str) -> None:
        for atom in types:
            if atom[0] == "cls":
                self.walk.touch(self.side, self.types.by_qual[atom[1]], how)
            elif atom[0] in ("func", "meth"):
                found = self.types.func_of(atom)
                if found is None:
                    continue
                module, cls, func = found
                if cls is not None:
                    if self.walk.index.kind(cls) == "protocol":
                        continue  # dispatched later, to the implementers
                    self.walk.touch(self.side, cls, "calls")
                self.walk.enter(self.side, module, cls, func)
