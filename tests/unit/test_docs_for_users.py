"""The repository speaks to its users: no path into the workshop it was built in (a sibling `shared` folder that a
clone does not have), and a README short enough to read, opening with the two commands."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SKIP = {".git", ".venv", "data", "test-output", ".hypothesis", ".mypy_cache", ".ruff_cache", "node_modules"}
TEXT = {".md", ".py", ".sh", ".toml", ".cfg", ".txt", ".js", ".html", ".css", ".yml", ".yaml", ".ini", ".service"}
WORKSHOP = "../" + "shared"  # spelled in two pieces so that this file does not hold it
README_LINES = 200


def workshop_paths(files: dict[str, str]) -> list[str]:
    """`path:line` of every line of `files` (path -> text) that points into the workshop."""
    return [
        f"{path}:{n}" for path, text in files.items() for n, line in enumerate(text.splitlines(), 1) if WORKSHOP in line
    ]


def _files() -> dict[str, str]:
    out = {}
    for path in REPO.rglob("*"):
        rel = path.relative_to(REPO)
        if rel.parts[0] in SKIP or "__pycache__" in rel.parts or not path.is_file():
            continue
        if path.suffix in TEXT or path.name in ("Makefile", "Procfile"):
            out[str(rel)] = path.read_text(encoding="utf-8", errors="replace")
    return out


def test_nothing_points_into_the_workshop() -> None:
    found = workshop_paths(_files())
    assert not found, "paths a clone does not have:\n" + "\n".join(found)
    assert workshop_paths({"docs/x.md": "see " + WORKSHOP + "/NOTES.md\n"}) == ["docs/x.md:1"]  # the check sees one


def test_the_readme_is_short_and_opens_with_serve_and_test() -> None:
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_LINES, f"README.md has {len(lines)} lines: move detail to docs/"
    top = "\n".join(lines[:20])
    assert "make serve" in top and "make test" in top
