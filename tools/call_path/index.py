"""The service's source read with ast: modules, classes, functions and what each imported name is.

Nothing is imported; module names come from the files under `service/llmserve/service`
(`engine/executor/executor.py` is `engine.executor`), so files may move without touching this tool.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVICE = ROOT / "service" / "llmserve" / "service"
PACKAGE = "llmserve.service"
Func = ast.FunctionDef | ast.AsyncFunctionDef
ENUM_BASES = {"Enum", "IntEnum", "StrEnum", "Flag", "IntFlag"}
EXCEPTION_BASES = {"Exception", "BaseException", "RuntimeError", "ValueError", "TypeError", "KeyError",
                   "OSError", "LookupError", "TimeoutError", "ConnectionError", "ArithmeticError"}


@dataclass
class ClassInfo:
    name: str
    module: ModuleInfo
    node: ast.ClassDef
    methods: dict[str, Func] = field(default_factory=dict)

    @property
    def qualname(self) -> str:
        return f"{self.module.name}.{self.name}"

    @property
    def path(self) -> str:
        return self.module.path

    def base_names(self) -> list[str]:
        return [ast.unparse(b).split("[")[0].split(".")[-1] for b in self.node.bases]

    def decorator_names(self) -> list[str]:
        return [ast.unparse(d).split("(")[0].split(".")[-1] for d in self.node.decorator_list]


@dataclass
class ModuleInfo:
    name: str  # dotted, relative to llmserve.service ("" for the package itself)
    path: str  # relative to service/llmserve/service, as the docs name files
    tree: ast.Module
    is_package: bool
    classes: dict[str, ClassInfo] = field(default_factory=dict)
    functions: dict[str, Func] = field(default_factory=dict)
    imports: dict[str, tuple[str, str | None]] = field(default_factory=dict)  # local -> (module, symbol)


class Index:
    """Every module of the service, and name resolution across them."""

    def __init__(self, root: Path = SERVICE) -> None:
        self.root = root
        self.modules: dict[str, ModuleInfo] = {}
        for path in sorted(root.rglob("*.py")):
            relative = path.relative_to(root)
            parts = list(relative.with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts = parts[:-1]
            module = ModuleInfo(".".join(parts), relative.as_posix(), ast.parse(path.read_text()), is_package)
            self.modules[module.name] = module
        for module in self.modules.values():
            self._read(module)

    def _read(self, module: ModuleInfo) -> None:
        for node in module.tree.body:
            if isinstance(node, ast.ClassDef):
                info = ClassInfo(node.name, module, node)
                info.methods = {n.name: n for n in node.body if isinstance(n, Func)}
                module.classes[node.name] = info
            elif isinstance(node, Func):
                module.functions[node.name] = node
        for node in ast.walk(module.tree):  # imports inside functions count too (late imports)
            if isinstance(node, ast.ImportFrom):
                base = self._import_base(module, node)
                if base is None:
                    continue
                for alias in node.names:
                    local = alias.asname or alias.name
                    submodule = f"{base}.{alias.name}" if base else alias.name
                    if submodule in self.modules:
                        module.imports[local] = (submodule, None)
                    else:
                        module.imports[local] = (base, alias.name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith(PACKAGE + "."):
                        module.imports[alias.asname or alias.name] = (alias.name[len(PACKAGE) + 1:], None)

    def _import_base(self, module: ModuleInfo, node: ast.ImportFrom) -> str | None:
        """The project module an import reads from ("" for the package), None when external."""
        if node.level == 0:
            name = node.module or ""
            if name == PACKAGE:
                return ""
            return name[len(PACKAGE) + 1:] if name.startswith(PACKAGE + ".") else None
        package = module.name.split(".") if module.name else []
        if not module.is_package:
            package = package[:-1]
        if node.level > 1:
            package = package[: len(package) - (node.level - 1)]
        parts = package + (node.module.split(".") if node.module else [])
        return ".".join(parts)

    # ------------------------------------------------------------ resolution

    def resolve(self, module: ModuleInfo, name: str, seen: frozenset[str] = frozenset()) -> object | None:
        """What `name` means at the top level of `module`: a ClassInfo, a (module, function) pair,
        a ModuleInfo, or None (external, a constant, unknown)."""
        if name in module.classes:
            return module.classes[name]
        if name in module.functions:
            return (module, module.functions[name])
        target = module.imports.get(name)
        if target is None:
            return None
        modname, symbol = target
        if modname not in self.modules:
            return None
        if symbol is None:
            return self.modules[modname]
        key = f"{modname}.{symbol}"
        if key in seen:
            return None
        return self.resolve(self.modules[modname], symbol, seen | {key})  # re-exports

    def bases(self, cls: ClassInfo) -> list[ClassInfo]:
        """The project classes `cls` derives from directly."""
        found = []
        for base in cls.node.bases:
            target = self.resolve_expr(cls.module, base)
            if isinstance(target, ClassInfo):
                found.append(target)
        return found

    def resolve_expr(self, module: ModuleInfo, expr: ast.expr) -> object | None:
        """A Name or a dotted Attribute (`responses.text_response`) at module level."""
        if isinstance(expr, ast.Subscript):
            expr = expr.value
        if isinstance(expr, ast.Name):
            return self.resolve(module, expr.id)
        if isinstance(expr, ast.Attribute):
            owner = self.resolve_expr(module, expr.value)
            if isinstance(owner, ModuleInfo):
                return self.resolve(owner, expr.attr)
        return None

    def mro(self, cls: ClassInfo) -> list[ClassInfo]:
        order, todo = [], [cls]
        while todo:
            c = todo.pop(0)
            if c not in order:
                order.append(c)
                todo.extend(self.bases(c))
        return order

    def find_method(self, cls: ClassInfo, name: str) -> tuple[ClassInfo, Func] | None:
        for c in self.mro(cls):
            if name in c.methods:
                return c, c.methods[name]
        return None

    @cached_property
    def all_classes(self) -> list[ClassInfo]:
        return [c for m in self.modules.values() for c in m.classes.values()]

    def kind(self, cls: ClassInfo) -> str:
        """enum, protocol, exception, marker (no fields, no methods), dataclass or class."""
        names = {b for c in self.mro(cls) for b in c.base_names()}
        if names & ENUM_BASES:
            return "enum"
        if "Protocol" in cls.base_names():
            return "protocol"
        if names & EXCEPTION_BASES or any(n.endswith(("Error", "Exception")) for n in names):
            return "exception"
        body = [n for n in cls.node.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
        if all(isinstance(n, ast.Pass) for n in body) and not self.bases(cls):
            return "marker"
        if "dataclass" in cls.decorator_names() or {"NamedTuple", "TypedDict"} & names:
            return "dataclass"
        return "class"
