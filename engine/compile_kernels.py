"""`python -m engine.compile_kernels MODEL [--quantize Q] [--activations A]`: compile the numba kernels that MODEL
needs into numba's on-disk cache (NUMBA_CACHE_DIR, inherited), in a process of its own.

The background compile (engine/backend_swap.py) runs this so that compiling, which holds the GIL for most of its
time, never stalls the serving process's step thread; the server then loads the kernels from the cache. Prints
`i n stage` on a line of stdout before each warm-up stage.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys

from engine.loader import load_model
from engine.model.llama import LlamaModel
from kernels import get_backend

NICE = 5  # scheduling weight a third of the server's (Linux CFS)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m engine.compile_kernels")
    p.add_argument("model")
    p.add_argument("--quantize", default=None)
    p.add_argument("--activations", default="f32")
    p.add_argument("--parent", type=int, default=None, help="end when this process does (Linux)")
    args = p.parse_args(argv)
    if args.parent is not None:
        _end_with(args.parent)
    os.nice(NICE)  # the server's replies come first; the compile takes the cycles they leave
    loaded = load_model(args.model, quantize=args.quantize)
    be = get_backend("numba", 1, args.activations)
    LlamaModel(loaded.config, loaded.weights, be, take=True)  # the weights' forms choose what compiles
    be.warm_up(lambda i, n, what: print(i, n, what, flush=True))
    be.check_routes()  # the gate's own kernels


def _end_with(parent: int) -> None:
    """Get SIGTERM when the parent ends (prctl PR_SET_PDEATHSIG): nobody waits for a compile any more."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it ended before the request took effect
        raise SystemExit(1)


if __name__ == "__main__":
    main(sys.argv[1:])
