"""The type of one expression (see types.py for what a type is)."""

from __future__ import annotations

import ast

from .index import ClassInfo, ModuleInfo
from .types import EMPTY, PASS_THROUGH, TO_SEQ, Scope, T, Types

CONTAINER_METHODS = {"get", "pop", "setdefault", "popleft", "copy", "values", "keys", "items", "result", "__getitem__"}


def expr_type(types: Types, e: ast.expr, scope: Scope) -> frozenset:
    if isinstance(e, ast.Name):
        if e.id in scope.env:
            return scope.env[e.id]
        return _symbol(types, scope.module, e.id)
    if isinstance(e, ast.Attribute):
        return attribute(types, types.expr(e.value, scope), e.attr)
    if isinstance(e, ast.Call):
        return _call(types, e, scope)
    if isinstance(e, ast.Await):
        return types.unwrap(types.expr(e.value, scope))
    if isinstance(e, ast.Subscript):
        index = e.slice.value if isinstance(e.slice, ast.Constant) and isinstance(e.slice.value, int) else None
        value = types.expr(e.value, scope)
        if isinstance(e.slice, ast.Slice):
            return value
        return types.item(value, index)
    if isinstance(e, ast.IfExp):
        return types.expr(e.body, scope) | types.expr(e.orelse, scope)
    if isinstance(e, ast.BoolOp):
        return T().union(*(types.expr(v, scope) for v in e.values))
    if isinstance(e, ast.NamedExpr):
        return types.expr(e.value, scope)
    if isinstance(e, ast.Tuple):
        return T({("tuple", tuple(types.expr(x, scope) for x in e.elts))})
    if isinstance(e, (ast.List, ast.Set)):
        return T({("seq", T().union(*(types.expr(x, scope) for x in e.elts if not isinstance(x, ast.Starred))))})
    if isinstance(e, (ast.ListComp, ast.SetComp, ast.GeneratorExp)):
        return T({("seq", types.expr(e.elt, scope))})
    if isinstance(e, ast.Dict):
        keys = T().union(*(types.expr(k, scope) for k in e.keys if k is not None))
        return T({("map", keys, T().union(*(types.expr(v, scope) for v in e.values)))})
    if isinstance(e, ast.DictComp):
        return T({("map", types.expr(e.key, scope), types.expr(e.value, scope))})
    return EMPTY


def _symbol(types: Types, module: ModuleInfo, name: str) -> frozenset:
    target = types.index.resolve(module, name)
    if isinstance(target, ClassInfo):
        return T({("cls", target.qualname)})
    if isinstance(target, ModuleInfo):
        return T({("mod", target.name)})
    if isinstance(target, tuple):
        return T({("func", target[0].name, target[1].name)})
    return EMPTY


def attribute(types: Types, value: frozenset, name: str) -> frozenset:
    result = EMPTY
    for atom in value:
        if atom[0] == "inst":
            result |= types.attr(types.by_qual[atom[1]], name)
        elif atom[0] == "cls":
            cls = types.by_qual[atom[1]]
            found = types.index.find_method(cls, name)
            if found:
                result |= T({("meth", found[0].qualname, name)})
            elif types.index.kind(cls) == "enum":
                result |= T({("inst", cls.qualname)})
            else:
                result |= types.attr(cls, name)
        elif atom[0] == "mod":
            result |= _symbol(types, types.index.modules[atom[1]], name)
        elif atom[0] in ("seq", "map", "tuple", "aw") and name in CONTAINER_METHODS:
            result |= T({("cmeth", atom, name)})
    return result


def _call(types: Types, e: ast.Call, scope: Scope) -> frozenset:
    name = ast.unparse(e.func).split(".")[-1]
    args = e.args
    if name in PASS_THROUGH and args:
        return types.expr(args[0], scope)
    if name == "cast" and args:
        return types.ann(args[0], scope.module)
    if name == "wrap_future" and args:
        return T({("aw", types.unwrap(types.expr(args[0], scope)))})
    if name in ("next", "anext") and args:
        return types.elem(types.expr(args[0], scope))
    if name in TO_SEQ and args:
        return T({("seq", types.elem(types.expr(args[0], scope)))})
    if name == "enumerate" and args:
        return T({("seq", T({("tuple", (EMPTY, types.elem(types.expr(args[0], scope))))}))})
    if name == "zip":
        return T({("seq", T({("tuple", tuple(types.elem(types.expr(a, scope)) for a in args))}))})
    if name == "super" and scope.cls is not None:
        return T({("super", scope.cls.qualname)})
    arguments = [types.expr(a.value if isinstance(a, ast.Starred) else a, scope) for a in args]
    return called(types, types.expr(e.func, scope), arguments)


def called(types: Types, func: frozenset, arguments: list[frozenset] | None = None) -> frozenset:
    """What calling a value of these types returns. A return annotation with TypeVars
    (`def offload(fn: Callable[..., T]) -> Future[T]`) stands for what the callables among
    `arguments` return."""
    result = EMPTY
    for atom in func:
        if atom[0] == "cls":
            result |= T({("inst", atom[1])})
        elif atom[0] in ("func", "meth"):
            found = types.func_of(atom)
            if found is None:
                continue
            typevars = types.typevars(found[0], found[2]) if arguments else set()
            if typevars:
                bound = T().union(*(called(types, a) for a in arguments or () if _callable(a)))
                result |= types.returns(found[0], found[2], dict.fromkeys(typevars, bound))
            else:
                result |= types.returns(found[0], found[2])
        elif atom[0] == "call":
            result |= atom[1]
        elif atom[0] == "cmeth":
            result |= _container_call(types, atom[1], atom[2])
    return result


def _callable(types: frozenset) -> bool:
    return any(a[0] in ("cls", "func", "meth", "call") for a in types)


def _container_call(types: Types, container: tuple, method: str) -> frozenset:
    kind = container[0]
    if kind == "map":
        if method in ("get", "pop", "setdefault", "__getitem__"):
            return container[2]
        if method == "values":
            return T({("seq", container[2])})
        if method == "keys":
            return T({("seq", container[1])})
        if method == "items":
            return T({("seq", T({("tuple", (container[1], container[2]))}))})
        return T({container})
    if kind == "aw" and method == "result":
        return container[1]
    if method in ("pop", "popleft", "__getitem__"):
        return types.elem(T({container}))
    return T({container}) if method == "copy" else EMPTY
