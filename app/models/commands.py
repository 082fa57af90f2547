"""`forge pull`, `forge models` and `forge rm`: the terminal side of app/models/catalog.py and engine/loader/hub.py."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from app.models.catalog import list_models, remove
from engine.loader.hub_names import PREFIX, format_size, parse_hub_ref


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """The three subcommands' flags."""
    p = sub.add_parser(
        "pull",
        help="download a GGUF model from the hub (REPO, REPO/FILE or REPO:QUANT)",
        description="Download a GGUF into the hub cache (HF_HOME), resuming a dropped connection, and check its "
        "size and sha256 against the hub. Then --model hf:NAME loads it without the network. Names: OWNER/REPO "
        "(its only GGUF, or its Q4_K_M), OWNER/REPO/FILE.gguf, OWNER/REPO:QUANT. HF_TOKEN opens gated repositories.",
    )
    p.add_argument("name", help="OWNER/REPO[/FILE.gguf][:QUANT], with or without the hf: prefix")
    p.add_argument("--quant", default=None, help="the quantization to take from a repository of several, e.g. Q4_K_M")

    p = sub.add_parser("models", help="list the models on disk (name, quantization, size, path)")
    p.add_argument("--json", action="store_true", help="one JSON array instead of a table")

    p = sub.add_parser("rm", help="remove a pulled model from disk")
    p.add_argument("name", help="a name `forge models` lists; OWNER/REPO removes all of its GGUFs")


def run(args: argparse.Namespace) -> None:
    """Run `args.command` (pull | models | rm); errors raise ModelLoadError (HubError) for main() to print."""
    if args.command == "pull":
        from engine.loader.hub import pull, repo_folder

        ref = parse_hub_ref(args.name, args.quant)
        path = pull(ref, say=lambda line: print(line, file=sys.stderr, flush=True))
        file = path.relative_to(repo_folder(ref.repo) / "snapshots").as_posix().split("/", 1)[1]  # past <revision>/
        print(f"{PREFIX}{ref.repo}/{file}\t{path}")
    elif args.command == "models":
        models = list_models()
        if args.json:
            rows = [{"name": m.name, "size": m.size, "quant": m.quant, "path": str(m.path)} for m in models]
            print(json.dumps(rows, indent=1))
        else:
            _table(
                [("NAME", "QUANT", "SIZE", "PATH")]
                + [(m.name, m.quant or "-", format_size(m.size), str(m.path)) for m in models]
            )
    elif args.command == "rm":
        for m in remove(args.name):
            print(f"removed {m.name} ({format_size(m.size)})")


def _table(rows: Sequence[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])
