"""Print which kernel each product takes on this CPU (or a simulated one), for each GGUF weight type and row count.

    .venv/bin/python scripts/route_table.py [--cpu avx2|avx2-no-f16c|avx512-vnni|amx] [--activations f32|q8]

The policy is kernels/routes.py; `forge serve` logs the routes its model takes and the start-up gate's checks.
"""

from __future__ import annotations

import argparse

from kernels import routes
from kernels.cpu import SIMULATED, CpuCaps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu", choices=sorted(SIMULATED), help="a simulated CPU kind (default: this one)")
    p.add_argument("--activations", choices=["f32", "q8"], help="one mode (default: both)")
    args = p.parse_args()
    caps = SIMULATED[args.cpu] if args.cpu else CpuCaps.detect()
    print(f"CPU: {caps.label}{'' if args.cpu else ' (detected)'}")
    for activations in [args.activations] if args.activations else ["f32", "q8"]:
        print(f"\nactivations {activations}; rows: " + ", ".join(map(str, routes.TABLE_ROWS)))
        for name, row in routes.table(caps, activations).items():
            spans, start = [], 0  # runs of one route, as row ranges
            for i in range(1, len(row) + 1):
                if i == len(row) or row[i] != row[start]:
                    lo, hi = routes.TABLE_ROWS[start], routes.TABLE_ROWS[i - 1]
                    spans.append(f"{lo}-{hi}: {row[start]}" if lo != hi else f"{lo}: {row[start]}")
                    start = i
            print(f"  {name:5s} " + " | ".join(spans))


if __name__ == "__main__":
    main()
