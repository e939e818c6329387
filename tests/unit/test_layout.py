"""The layout rules of docs/design.md, checked on the source: no import cycle between the modules of
``tandem`` (imports inside functions and under ``TYPE_CHECKING`` included), no ``_private`` name taken
from another module, no module over 600 lines.

The checker reads files with :mod:`ast` and imports nothing, so it also sees lazy imports that a run would
never execute. It is tested on small packages written to ``tmp_path`` so that a broken checker cannot
pass the real tree by finding nothing.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

import tandem

PACKAGE = Path(tandem.__file__).resolve().parent
MAX_LINES = 600


@dataclass(frozen=True)
class Package:
    """The modules of one package: dotted name -> file (``pkg.sub`` for ``pkg/sub/__init__.py``)."""

    modules: dict[str, Path]

    @classmethod
    def read(cls, root: Path) -> Package:
        modules = {}
        for path in sorted(root.rglob("*.py")):
            parts = path.with_suffix("").relative_to(root.parent).parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
        return cls(modules)

    def is_package(self, name: str) -> bool:
        return self.modules[name].name == "__init__.py"

    def trees(self):
        for name, path in self.modules.items():
            yield name, ast.parse(path.read_text(), filename=str(path))


def imported_from(pkg: Package, module: str, node: ast.ImportFrom) -> str:
    """The absolute name ``node`` imports from (relative imports resolved against ``module``)."""
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    if not pkg.is_package(module):
        parts = parts[:-1]
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join([*parts, node.module] if node.module else parts)


def _targets(pkg: Package, module: str, node: ast.Import | ast.ImportFrom) -> set[str]:
    """Modules of ``pkg`` whose code ``node`` depends on. ``from P import sub`` depends on the submodule;
    it depends on ``P``'s own ``__init__`` too unless ``P`` contains ``module`` (then ``P`` was imported
    before ``module`` and only names defined in it are a dependency)."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names if a.name in pkg.modules}
    source = imported_from(pkg, module, node)
    out: set[str] = set()
    for alias in node.names:
        sub = f"{source}.{alias.name}"
        if sub in pkg.modules:
            out.add(sub)
        if source in pkg.modules and (sub not in pkg.modules or not module.startswith(source + ".")):
            out.add(source)
    out.discard(module)
    return out


def import_graph(pkg: Package) -> dict[str, set[str]]:
    """Module -> the modules of the package it imports anywhere in its file (top level, functions,
    ``TYPE_CHECKING`` blocks)."""
    graph: dict[str, set[str]] = {name: set() for name in pkg.modules}
    for name, tree in pkg.trees():
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                graph[name] |= _targets(pkg, name, node)
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _dotted(expr: ast.expr) -> str | None:
    """``a.b.c`` for a chain of attribute reads on a name, else None."""
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute):
        base = _dotted(expr.value)
        return None if base is None else f"{base}.{expr.attr}"
    return None


def private_imports(pkg: Package) -> list[str]:
    """``file:line: module.name`` for every ``_private`` name one module takes from another module of
    the package: ``from m import _x`` (absolute or relative, at any depth), ``import m._x``, or
    ``m._x`` read through a name bound to a module of the package."""
    roots = {name.split(".")[0] for name in pkg.modules}
    found = []
    for name, tree in pkg.trees():
        where = pkg.modules[name]
        bound: dict[str, str] = {}  # local name -> the module of the package it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] in roots and any(map(_is_private, alias.name.split("."))):
                        found.append(f"{where}:{node.lineno}: {alias.name}")
                    if alias.name in pkg.modules:
                        local = alias.asname or alias.name.split(".")[0]
                        bound[local] = alias.name if alias.asname else local
            elif isinstance(node, ast.ImportFrom):
                source = imported_from(pkg, name, node)
                if source.split(".")[0] not in roots:
                    continue
                for alias in node.names:
                    if _is_private(alias.name) or any(map(_is_private, source.split("."))):
                        found.append(f"{where}:{node.lineno}: {source}.{alias.name}")
                    if f"{source}.{alias.name}" in pkg.modules:
                        bound[alias.asname or alias.name] = f"{source}.{alias.name}"
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and _is_private(node.attr)):
                continue
            dotted = _dotted(node.value)
            if dotted is None or dotted.split(".")[0] not in bound:
                continue
            head, _, rest = dotted.partition(".")
            module = f"{bound[head]}.{rest}" if rest else bound[head]
            if module in pkg.modules:
                found.append(f"{where}:{node.lineno}: {module}.{node.attr}")
    return found


def long_modules(pkg: Package, limit: int = MAX_LINES) -> list[str]:
    """``file: N lines`` for every module longer than ``limit`` lines."""
    counts = {path: len(path.read_text().splitlines()) for path in pkg.modules.values()}
    return [f"{path}: {n} lines" for path, n in counts.items() if n > limit]


# -- the rules on the real tree ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tree() -> Package:
    return Package.read(PACKAGE)


def test_tandem_has_no_import_cycles(tree):
    cycles = import_cycles(import_graph(tree))
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_no_private_name_is_imported_across_modules(tree):
    assert private_imports(tree) == []


def test_no_module_over_600_lines(tree):
    assert long_modules(tree) == []


def test_cli_command_modules_import_only_the_app_root(tree):
    """``tandem.cli.main`` imports the command modules; none of them imports it (or another command
    module), so registering a command never needs the entry point."""
    graph = import_graph(tree)
    command_modules = graph["tandem.cli.main"] - {"tandem.cli.app"}
    assert {"tandem.cli.train", "tandem.cli.data", "tandem.cli.serve"} <= command_modules
    for module in command_modules:
        assert not graph[module] & (command_modules | {"tandem.cli.main"}), module


# -- the checker on planted packages ----------------------------------------------------------------------


def _write(root: Path, files: dict[str, str]) -> Package:
    for rel, text in files.items():
        path = root / "pkg" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return Package.read(root / "pkg")


def test_checker_finds_a_cycle_closed_by_a_lazy_import(tmp_path):
    pkg = _write(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "from pkg.b import f\n",
            "b.py": "def f():\n    from pkg.sub import c\n    return c\n",
            "sub/__init__.py": "",
            "sub/c.py": "import typing\nif typing.TYPE_CHECKING:\n    from ..a import x\n",
            "d.py": "from pkg.a import f\n",  # depends on the cycle, is not part of it
        },
    )
    assert import_cycles(import_graph(pkg)) == [["pkg.a", "pkg.b", "pkg.sub.c"]]


def test_checker_finds_a_submodule_reading_names_from_its_package_that_imports_it(tmp_path):
    pkg = _write(
        tmp_path, {"__init__.py": "from pkg.m import g\nLIMIT = 3\n", "m.py": "from pkg import LIMIT\n"}
    )
    assert import_cycles(import_graph(pkg)) == [["pkg", "pkg.m"]]


def test_checker_accepts_facades_and_sibling_submodule_imports(tmp_path):
    pkg = _write(
        tmp_path,
        {
            "__init__.py": "from pkg.a import f\nfrom pkg.b import g\n",
            "a.py": "from pkg import b\n\ndef f():\n    return b.g()\n",  # a submodule, not pkg's names
            "b.py": "from . import c\ndef g():\n    return c.h()\n",
            "c.py": "def h():\n    return 1\n",
        },
    )
    graph = import_graph(pkg)
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.b"] == {"pkg.c"}
    assert import_cycles(graph) == []


def test_checker_finds_private_names_taken_across_modules(tmp_path):
    pkg = _write(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "_x = 1\n\ndef _f():\n    return _x\n__all__ = []\n",
            "b.py": "from pkg.a import _x\n",
            "c.py": "def g():\n    from .a import _f\n    return _f()\n",
            "d.py": "from pkg import a\n\ndef g():\n    return a._x\n",
            "f.py": "import pkg.a\nimport pkg.a as alias\nprint(pkg.a._f, alias._x)\n",
            "e.py": "from pkg.a import __all__\nimport os\nprint(os._exit)\n",  # dunders, other packages: fine
        },
    )
    found = private_imports(pkg)
    assert [line.split(": ")[1] for line in found] == [
        "pkg.a._x",
        "pkg.a._f",
        "pkg.a._x",
        "pkg.a._f",
        "pkg.a._x",
    ]
    assert [Path(line.split(":")[0]).name for line in found] == ["b.py", "c.py", "d.py", "f.py", "f.py"]


def test_checker_finds_long_modules(tmp_path):
    pkg = _write(tmp_path, {"__init__.py": "", "long.py": "x = 1\n" * 601, "ok.py": "x = 1\n" * 600})
    assert [Path(line.split(":")[0]).name for line in long_modules(pkg)] == ["long.py"]
