"""Static types of expressions, as far as annotations and assignments tell (no imports, no mypy).

A type is a frozenset of atoms (a union): ("inst", class qualname), ("cls", qualname),
("func", module, name), ("meth", class qualname, name), ("mod", module), ("seq", T),
("map", K, V), ("tuple", (T1, ...)), ("aw", T) (awaitable, future), ("call", T). Anything
external (grpc, numpy, builtins) is the empty set: unknown, never followed.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from .index import ClassInfo, Func, Index, ModuleInfo

T = frozenset
EMPTY: frozenset = frozenset()
SEQ_NAMES = {"list", "set", "frozenset", "Sequence", "Iterable", "Iterator", "AsyncIterator", "AsyncIterable",
             "Generator", "AsyncGenerator", "deque", "Collection", "MutableSequence", "AbstractSet", "KeysView",
             "ValuesView"}
MAP_NAMES = {"dict", "Mapping", "MutableMapping", "OrderedDict", "defaultdict"}
AW_NAMES = {"Future", "Awaitable", "Coroutine", "Task"}
PASS_THROUGH = {"replace", "wait_for", "shield", "ensure_future", "create_task", "aclosing", "closing", "copy"}
TO_SEQ = {"iter", "aiter", "list", "tuple", "sorted", "reversed", "set", "frozenset", "deque", "filter"}


@dataclass
class Scope:
    module: ModuleInfo
    cls: ClassInfo | None
    env: dict[str, frozenset] = field(default_factory=dict)


class Types:
    def __init__(self, index: Index) -> None:
        self.index = index
        self.by_qual = {c.qualname: c for c in index.all_classes}
        self._attrs: dict[tuple[str, str], frozenset] = {}
        self._envs: dict[int, dict[str, frozenset]] = {}

    # ------------------------------------------------------------ annotations

    def ann(self, expr: ast.expr | None, module: ModuleInfo, subst: dict[str, frozenset] | None = None) -> frozenset:
        """An annotation's type; `subst`: what the TypeVars in it stand for at this call."""
        if expr is None:
            return EMPTY
        if subst and isinstance(expr, ast.Name) and expr.id in subst:
            return subst[expr.id]
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            try:
                return self.ann(ast.parse(expr.value, mode="eval").body, module, subst)
            except SyntaxError:
                return EMPTY
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.BitOr):
            return self.ann(expr.left, module, subst) | self.ann(expr.right, module, subst)
        if isinstance(expr, ast.Subscript):
            return self._generic(expr, module, subst)
        target = self.index.resolve_expr(module, expr)
        if isinstance(target, ClassInfo):
            return T({("inst", target.qualname)})
        return EMPTY

    def _generic(self, expr: ast.Subscript, module: ModuleInfo, subst: dict[str, frozenset] | None) -> frozenset:
        origin = ast.unparse(expr.value).split(".")[-1]
        args = list(expr.slice.elts) if isinstance(expr.slice, ast.Tuple) else [expr.slice]
        if origin in ("Optional", "Union", "ClassVar", "Final", "Annotated"):
            return T().union(*(self.ann(a, module, subst) for a in (args[:1] if origin == "Annotated" else args)))
        if origin in SEQ_NAMES:
            return T({("seq", self.ann(args[0], module, subst))})
        if origin in MAP_NAMES:
            return T({("map", self.ann(args[0], module, subst), self.ann(args[-1], module, subst))})
        if origin == "tuple":
            if len(args) == 2 and isinstance(args[1], ast.Constant) and args[1].value is Ellipsis:
                return T({("seq", self.ann(args[0], module, subst))})
            return T({("tuple", tuple(self.ann(a, module, subst) for a in args))})
        if origin in AW_NAMES:
            return T({("aw", self.ann(args[-1], module, subst))})
        if origin == "Callable":
            return T({("call", self.ann(args[-1], module, subst))})
        if origin == "type":
            return T(("cls", a[1]) for a in self.ann(args[0], module, subst) if a[0] == "inst")
        return self.ann(expr.value, module, subst)

    # ------------------------------------------------------------ functions and attributes

    def typevars(self, module: ModuleInfo, func: Func) -> set[str]:
        """The TypeVars (module-level `T = TypeVar(...)`) in `func`'s return annotation."""
        declared = {t.id for n in module.tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
                    and ast.unparse(n.value.func).endswith("TypeVar") for t in n.targets if isinstance(t, ast.Name)}
        returns = func.returns
        if isinstance(returns, ast.Constant) and isinstance(returns.value, str):
            returns = ast.parse(returns.value, mode="eval").body
        return {n.id for n in ast.walk(returns) if isinstance(n, ast.Name)} & declared if returns else set()

    def returns(self, module: ModuleInfo, func: Func, subst: dict[str, frozenset] | None = None) -> frozenset:
        result = self.ann(func.returns, module, subst)
        if isinstance(func, ast.AsyncFunctionDef) and not _is_generator(func):
            return T({("aw", result)})
        return result

    def func_of(self, atom: tuple) -> tuple[ModuleInfo, ClassInfo | None, Func] | None:
        if atom[0] == "func":
            module = self.index.modules[atom[1]]
            return module, None, module.functions[atom[2]]
        if atom[0] == "meth":
            cls = self.by_qual[atom[1]]
            return cls.module, cls, cls.methods[atom[2]]
        return None

    def attr(self, cls: ClassInfo, name: str) -> frozenset:
        """The type of `instance.name`: a field, an attribute set in a method, a property, a method."""
        key = (cls.qualname, name)
        if key in self._attrs:
            return self._attrs[key]
        self._attrs[key] = EMPTY  # a cycle reads as unknown
        result = EMPTY
        for c in self.index.mro(cls):
            result = self._own_attr(c, name)
            if result:
                break
        self._attrs[key] = result
        return result

    def _own_attr(self, cls: ClassInfo, name: str) -> frozenset:
        method = cls.methods.get(name)
        if method is not None:
            if _is_property(method):
                return self.ann(method.returns, cls.module)
            return T({("meth", cls.qualname, name)})
        result = EMPTY
        for node in cls.node.body:
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
                result |= self.ann(node.annotation, cls.module)
            elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                value = self.expr(node.value, Scope(cls.module, None))
                result |= T({("inst", cls.qualname)}) if "enum" == self.index.kind(cls) else value
        for method in cls.methods.values():
            result |= self._assigned_in(cls, method, name)
        return result

    def _assigned_in(self, cls: ClassInfo, method: Func, name: str) -> frozenset:
        result = EMPTY
        for node in ast.walk(method):
            if isinstance(node, ast.AnnAssign) and _is_self_attr(node.target, name):
                result |= self.ann(node.annotation, cls.module)
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    if _is_self_attr(target, name):
                        result |= self.expr(node.value, self.scope(cls.module, cls, method))
                    elif isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                        for t, v in zip(target.elts, node.value.elts):
                            if _is_self_attr(t, name):
                                result |= self.expr(v, self.scope(cls.module, cls, method))
        return result

    # ------------------------------------------------------------ local variables

    def scope(self, module: ModuleInfo, cls: ClassInfo | None, func: Func) -> Scope:
        """Each local's type, flow-insensitively (the union of everything assigned to it)."""
        if id(func) not in self._envs:
            env: dict[str, frozenset] = {}
            self._envs[id(func)] = env  # a cycle sees what is known so far
            scope = Scope(module, cls, env)
            self._params(func, scope, cls)
            for _ in range(3):  # a few rounds: a local typed from another local defined later
                for node in ast.walk(func):
                    self._bind(node, scope)
        return Scope(module, cls, dict(self._envs[id(func)]))

    def _params(self, func: Func, scope: Scope, cls: ClassInfo | None) -> None:
        for node in ast.walk(func):
            if isinstance(node, Func):
                for arg in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]:
                    scope.env[arg.arg] = scope.env.get(arg.arg, EMPTY) | self.ann(arg.annotation, scope.module)
        positional = [*func.args.posonlyargs, *func.args.args]
        decorators = {ast.unparse(d) for d in func.decorator_list}
        if cls is not None and positional and "staticmethod" not in decorators:
            atom = ("cls" if "classmethod" in decorators else "inst", cls.qualname)
            scope.env[positional[0].arg] = T({atom})

    def _bind(self, node: ast.AST, scope: Scope) -> None:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                self.assign(target, self.expr(node.value, scope), scope, node.value)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            self.assign(node.target, self.ann(node.annotation, scope.module), scope)
        elif isinstance(node, ast.NamedExpr):
            self.assign(node.target, self.expr(node.value, scope), scope)
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
            self.assign(node.target, self.elem(self.expr(node.iter, scope)), scope)
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                if item.optional_vars is not None:
                    self.assign(item.optional_vars, self.entered(self.expr(item.context_expr, scope)), scope)
        elif isinstance(node, ast.ExceptHandler) and node.name and node.type is not None:
            self.assign(ast.Name(node.name), self.instances(self.expr(node.type, scope)), scope)

    def assign(self, target: ast.expr, value: frozenset, scope: Scope, value_expr: ast.expr | None = None) -> None:
        if isinstance(target, ast.Name):
            scope.env[target.id] = scope.env.get(target.id, EMPTY) | value
        elif isinstance(target, (ast.Tuple, ast.List)):
            if isinstance(value_expr, ast.Tuple) and len(value_expr.elts) == len(target.elts):
                for t, v in zip(target.elts, value_expr.elts):
                    self.assign(t, self.expr(v, scope), scope)
                return
            for i, t in enumerate(target.elts):
                self.assign(t, self.item(value, i), scope)

    # ------------------------------------------------------------ helpers on types

    def elem(self, types: frozenset) -> frozenset:
        """What iterating over a value of these types yields."""
        result = EMPTY
        for atom in types:
            if atom[0] == "seq":
                result |= atom[1]
            elif atom[0] == "map":
                result |= atom[1]
            elif atom[0] == "tuple":
                result = result.union(*atom[1])
            elif atom[0] == "inst":
                for name in ("__iter__", "__aiter__"):
                    found = self.index.find_method(self.by_qual[atom[1]], name)
                    if found:
                        result |= self.elem(self.returns(found[0].module, found[1]))
        return result

    def item(self, types: frozenset, i: int | None) -> frozenset:
        result = EMPTY
        for atom in types:
            if atom[0] == "tuple":
                result |= atom[1][i] if i is not None and -len(atom[1]) <= i < len(atom[1]) else T().union(*atom[1])
            elif atom[0] == "seq":
                result |= atom[1]
            elif atom[0] == "map":
                result |= atom[2]
        return result

    def entered(self, types: frozenset) -> frozenset:
        """`with x as y`: a project class's __enter__ result, else x itself (aclosing, ...)."""
        result = EMPTY
        for atom in types:
            if atom[0] == "inst":
                cls = self.by_qual[atom[1]]
                found = self.index.find_method(cls, "__aenter__") or self.index.find_method(cls, "__enter__")
                if found:
                    result |= self.unwrap(self.returns(found[0].module, found[1]))
                    continue
            result |= T({atom})
        return result

    def instances(self, types: frozenset) -> frozenset:
        """`isinstance(x, C)` / `except C`: the classes named, as instances."""
        result = EMPTY
        for atom in types:
            if atom[0] == "cls":
                result |= T({("inst", atom[1])})
            elif atom[0] == "tuple":
                result |= self.instances(T().union(*atom[1]))
        return result

    @staticmethod
    def unwrap(types: frozenset) -> frozenset:
        return T().union(*(a[1] if a[0] == "aw" else T({a}) for a in types))

    def expr(self, e: ast.expr | None, scope: Scope) -> frozenset:
        from .expressions import expr_type  # the expression rules, in a module of their own

        return expr_type(self, e, scope) if e is not None else EMPTY


def _is_self_attr(target: ast.expr, name: str) -> bool:
    return (isinstance(target, ast.Attribute) and target.attr == name and isinstance(target.value, ast.Name)
            and target.value.id == "self")


def _is_property(func: Func) -> bool:
    return any(ast.unparse(d).split(".")[-1] in ("property", "cached_property") for d in func.decorator_list)


def _is_generator(func: Func) -> bool:
    for node in ast.walk(func):
        if isinstance(node, (ast.Yield, ast.YieldFrom)):
            return True
    return False
