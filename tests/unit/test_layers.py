"""The layers' arrows, read from the source with ast (every import, also those inside functions and
TYPE_CHECKING blocks): app -> engine -> kernels; app's domain (app/domain/) under its HTTP layer (app/api/, Litestar);
no import cycle among app's modules."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _module(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(source: str, module: str, is_package: bool = False) -> set[str]:
    """Every module `source` (of `module`) imports: `import a.b` -> a.b; `from a import b` -> a and a.b (b may be a
    submodule); relative imports resolved against `module`."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                package = package[: len(package) - node.level + 1]
                base = ".".join([*package, base] if base else package)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _modules(package: str) -> dict[str, set[str]]:
    out = {}
    for path in sorted((REPO / package).rglob("*.py")):
        name = _module(path)
        out[name] = imports(path.read_text(encoding="utf-8"), name, path.name == "__init__.py")
    return out


def _under(name: str, *roots: str) -> bool:
    return any(name == root or name.startswith(root + ".") for root in roots)


def _reach(graph: dict[str, set[str]], start: str) -> dict[str, str]:
    """Modules of `graph` reachable from `start` -> the module that imports each (first found)."""
    seen: dict[str, str] = {}
    todo = [start]
    while todo:
        here = todo.pop()
        for name in graph.get(here, ()):
            if name in graph and name not in seen and name != start:
                seen[name] = here
                todo.append(name)
    return seen


def test_the_walker_sees_every_kind_of_import() -> None:
    source = (
        "import litestar\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from app.api import errors\n"
        "def f():\n    from ..api.state import Services\n    import engine.types as t\n"
    )
    found = imports(source, "app.domain.chat")
    assert {"litestar", "app.api", "app.api.errors", "app.api.state", "app.api.state.Services", "engine.types"} <= found
    assert imports("from . import errors\n", "app.domain", is_package=True) == {"app.domain", "app.domain.errors"}


def test_the_domain_imports_neither_the_http_layer_nor_litestar() -> None:
    app = _modules("app")
    domain = [name for name in app if _under(name, "app.domain")]
    assert "app.domain.chat" in domain and "app.domain.errors" in domain
    bad = []
    for name in domain:
        # its own imports, and those of the app modules it reaches (app.metrics, app.store, ...)
        reached = {name: ""} | _reach(app, name)
        for mod in reached:
            bad += [
                f"{name}{' via ' + mod if mod != name else ''}: {imp}"
                for imp in sorted(app[mod])
                if _under(imp, "app.api", "litestar")
            ]
    assert not bad, "the domain must not import app.api or litestar:\n" + "\n".join(bad)


def test_arrows_point_only_down_app_engine_kernels() -> None:
    bad = [
        f"{name}: {imp}" for name, found in _modules("engine").items() for imp in sorted(found) if _under(imp, "app")
    ]
    bad += [
        f"{name}: {imp}"
        for name, found in _modules("kernels").items()
        for imp in sorted(found)
        if _under(imp, "engine", "app")
    ]
    assert not bad, "engine must not import app, nor kernels engine or app:\n" + "\n".join(bad)


def test_no_import_cycle_among_the_apps_modules() -> None:
    app = _modules("app")
    cycles = sorted(
        f"{name} reaches {mod}, which imports it" for name in app for mod in _reach(app, name) if name in app[mod]
    )
    assert not cycles, "import cycles in app/:\n" + "\n".join(cycles)
