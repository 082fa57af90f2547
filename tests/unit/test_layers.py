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


# -- the engine's façade ------------------------------------------------------------------------------------------
# The app uses `engine` (engine/__init__.py: Engine and the types it re-exports) and `engine.types` (the plain
# data that crosses the façade) only. What reached further when this guard came in is listed with why; a new entry
# needs a reason as good, and the way out is a name the façade exports.
FACADE = {"engine", "engine.types"}
INTERNALS_ALLOWED: dict[tuple[str, str], str] = {
    ("app.cli", "engine.bench"): "`forge bench` runs the engine's own benchmark",
    ("app.cli", "engine.loader"): "`forge generate` reports a model that fails to load",
    ("app.cli", "engine.loader.synth"): "`forge synth` writes a synthetic GGUF",
    ("app.server", "engine.loader"): "start-up checks the model path before the engine loads",
    ("app.config", "engine.engine"): "a KV spill size read as the engine reads sizes (parse_size)",
    ("app.config", "kernels"): "--activations checked against the backend before anything loads",
    ("app.domain.begin", "engine.engine"): "a turn's start holds the engine's RequestStream",
    ("app.domain.run", "engine.engine"): "the turn runner reads the engine's RequestStream",
    ("app.domain.prompt", "engine.tool_calls"): "the prompt renders the session's tools",
    ("app.domain.tools", "engine.tool_calls"): "tool plans build the engine's tool grammar",
    ("app.domain.tools", "engine.tool_parser"): "tool calls are split out of the reply's text",
    ("app.domain.turn", "engine.tool_calls"): "a turn carries the tool format of its model",
    ("app.models.catalog", "engine.loader"): "the model catalogue lists what the loader can open",
    ("app.models.catalog", "engine.loader.hub"): "the model catalogue reads the hub cache",
    ("app.models.catalog", "engine.loader.hub_names"): "the model catalogue names hub models",
    ("app.models.catalog", "engine.loader.hub_verify"): "the model catalogue discards broken downloads",
    ("app.models.commands", "engine.loader.hub"): "`forge pull` downloads through the loader's hub",
    ("app.models.commands", "engine.loader.hub_names"): "`forge pull` parses hub names",
}


def module_imports(sources: dict[str, str], root: str) -> dict[str, set[str]]:
    """For each module of `sources` (module name -> text): the modules under `root` it imports, every import counted
    (module level, in functions, under TYPE_CHECKING). A name imported from a module counts as that module, and
    `from pkg import sub` as the submodule `pkg.sub`, not the package."""
    known = set(sources)
    packages = {name.rpartition(".")[0] for name in known} | {root}

    def resolve(name: str) -> str:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name

    out: dict[str, set[str]] = {}
    for module, source in sources.items():
        package = module.split(".") if module in packages else module.split(".")[:-1]
        found = set()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                found.update(resolve(alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package[: len(package) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    found.add(sub if sub in known else resolve(base))
        out[module] = {m for m in found if m and _under(m, root) and m != module}
    return out


def _sources(*packages: str) -> dict[str, str]:
    return {
        _module(path): path.read_text(encoding="utf-8")
        for package in packages
        for path in sorted((REPO / package).rglob("*.py"))
    }


def facade_breaches(sources: dict[str, str], allowed: dict[tuple[str, str], str]) -> list[str]:
    """App modules importing engine or kernels modules beyond the façade, not in `allowed`."""
    engine, kernels = module_imports(sources, "engine"), module_imports(sources, "kernels")
    bad = []
    for name in sorted(n for n in sources if _under(n, "app")):
        deps = engine[name] | kernels[name]
        bad += [f"{name}: {dep}" for dep in sorted(deps - FACADE) if (name, dep) not in allowed]
    return bad


def test_the_app_uses_the_engine_through_its_facade() -> None:
    bad = facade_breaches(_sources("app", "engine", "kernels"), INTERNALS_ALLOWED)
    assert not bad, "app modules reaching past engine's façade (export it from engine/__init__.py):\n" + "\n".join(bad)


# -- cycles inside engine/ and kernels/ -----------------------------------------------------------------------------
# Imports that close a cycle, listed when this guard came in with why; every other import must point one way.
CYCLE_EDGES_ALLOWED: dict[tuple[str, str], str] = {
    ("engine.types", "engine.tool_calls"): "GenerationRequest names ToolFormat for type checking only",
    ("kernels.gate", "kernels.numba_backend"): "the gate names the backend it checks for type checking only",
    ("kernels.numba_backend", "kernels"): "the backend reads the package's ACTIVATIONS",
}


def cycles(graph: dict[str, set[str]], allowed: dict[tuple[str, str], str]) -> list[str]:
    """Pairs of modules that reach each other once the `allowed` imports are set aside (every other import counts:
    at module level, in functions and under TYPE_CHECKING)."""
    kept = {name: {dep for dep in deps if (name, dep) not in allowed} for name, deps in graph.items()}
    found = {frozenset({name, mod}) for name in kept for mod in _reach(kept, name) if name in kept[mod]}
    return sorted(" <-> ".join(sorted(pair)) for pair in found)


def test_no_import_cycle_inside_engine_or_kernels() -> None:
    for package in ("engine", "kernels"):
        bad = cycles(module_imports(_sources(package), package), CYCLE_EDGES_ALLOWED)
        assert not bad, f"import cycles in {package}/:\n" + "\n".join(bad)


def test_the_guards_see_planted_violations() -> None:
    engine = {
        "engine": "from engine.engine import Engine\n",
        "engine.engine": "from engine import tool_render\nclass Engine: ...\n",
        "engine.tool_render": "X = 1\n",
        "engine.types": "class T: ...\n",
    }
    fine = {**engine, "app.a": "from engine import Engine\nfrom engine.types import T\n"}
    assert facade_breaches(fine, {}) == []
    inside = {**engine, "app.a": "from engine.tool_render import X\n", "app.b": "import kernels.simd\n"}
    inside["kernels"] = inside["kernels.simd"] = ""
    assert facade_breaches(inside, {}) == ["app.a: engine.tool_render", "app.b: kernels.simd"]
    assert facade_breaches(inside, {("app.a", "engine.tool_render"): "planted", ("app.b", "kernels.simd"): "-"}) == []
    # `from engine import tool_render` is the submodule, not a cycle through the package
    assert cycles(module_imports(engine, "engine"), {}) == []
    looped = {**engine, "engine.tool_render": "def f():\n    from engine.engine import Engine\n"}
    assert cycles(module_imports(looped, "engine"), {}) == ["engine.engine <-> engine.tool_render"]
    typed = {**engine, "engine.types": "if TYPE_CHECKING:\n    from engine.engine import Engine\n"}
    typed["engine.engine"] += "from engine.types import T\n"
    assert cycles(module_imports(typed, "engine"), {}) == ["engine.engine <-> engine.types"]
    assert cycles(module_imports(typed, "engine"), {("engine.types", "engine.engine"): "planted"}) == []
