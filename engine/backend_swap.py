"""Serve at once on a machine whose numba kernels are not compiled yet: the NumPy reference (the weights
dequantized to float32) serves while the numba kernels compile in a child process (engine/compile_kernels.py:
compiling holds the GIL, which would stall the step thread) and a background thread then prepares the numba model
from numba's disk cache; the step thread takes the numba model between two steps (`Engine`).

Both CPU backends keep the KV cache in float32 with one layout (kernels/host_ops.py), so the cache, the prefix
cache and every running sequence carry over: a reply in flight continues on the compiled kernels. The two agree
to float32 rounding (the start-up parity gate bounds it), which leaves greedy output unchanged.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from engine.loader import LoadedModel
from engine.model.llama import LlamaModel
from kernels import Backend, NumpyBackend, RouteCheck, compile_stamp
from kernels.weight import Weight

if TYPE_CHECKING:
    from kernels.numba_backend import NumbaBackend

log = logging.getLogger("forge.engine")

# The float32 copy of the weights may take at most this share of the memory available at start: the
# quantized model is prepared beside it, and the KV cache comes on top.
MEMORY_SHARE = 0.25
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # where `engine` imports from


@dataclass(slots=True)
class SwapState:
    """Where the background build is: `phase` "compiling" -> "ready" -> "done", or "failed" (the reference
    keeps serving). `step` of `steps` warm-up stages, the current one named by `stage`."""

    phase: str = "compiling"
    step: int = 0
    steps: int = 0
    stage: str = "preparing weights"
    started: float = 0.0
    seconds: float | None = None  # the build's, once finished
    error: str | None = None


def model_key(loaded: LoadedModel, quantize: str | None, activations: str) -> str:
    """What selects the compiled signatures for a model: its file, quantization and activations."""
    try:
        size = os.path.getsize(loaded.path)
    except OSError:
        size = 0
    return f"{os.path.abspath(loaded.path)}|{size}|{loaded.quant}|{quantize}|{activations}"


def available_memory() -> int | None:
    """MemAvailable in bytes (Linux), None when unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


class BackendSwap:
    """The numba model built on a background thread while the reference serves. `take` (on the step thread,
    between steps) hands it over once ready; `state` says how far the build is."""

    def __init__(
        self,
        loaded: LoadedModel,
        backend: NumbaBackend,
        key: str,
        say: Callable[[str], None],
        quantize: str | None = None,
    ) -> None:
        self.loaded, self.backend, self.key, self.say, self.quantize = loaded, backend, key, say, quantize
        self.state = SwapState()
        self._result: tuple[LlamaModel, list[RouteCheck]] | None = None
        self._thread: threading.Thread | None = None
        self._proc: subprocess.Popen | None = None
        self._closed = False

    @classmethod
    def plan(
        cls, loaded: LoadedModel, backend: Backend, key: str, say: Callable[[str], None], quantize: str | None = None
    ) -> BackendSwap | None:
        """A swap when `backend` is numba with float32 activations (the reference's agreement), its kernels are
        not compiled for `key` here (kernels/compile_stamp.py), and the float32 weights fit MEMORY_SHARE of the
        available memory; None otherwise (the caller compiles before serving, as without a swap)."""
        if backend.name != "numba" or getattr(backend, "activations", "f32") != "f32":
            return None
        if compile_stamp.is_compiled(key):
            return None
        need = 4 * sum(
            int(w.shape[0] * w.shape[1]) if isinstance(w, Weight) else w.size for w in loaded.weights.values()
        )
        free = available_memory()
        if free is None or need > MEMORY_SHARE * free:
            say(
                f"compiling CPU kernels before serving: float32 weights ({need >> 20} MiB) would take more than "
                f"{MEMORY_SHARE:.0%} of the available memory"
            )
            return None
        return cls(loaded, cast("NumbaBackend", backend), key, say, quantize)

    def reference_model(self) -> tuple[LlamaModel, list[RouteCheck]]:
        """The model on the NumPy reference (the loaded weights stay for the numba build) and its gate checks."""
        ref = NumpyBackend()
        ref.choice = "numpy (float32 reference, while the numba kernels compile)"
        # The compile takes a core: two BLAS threads sharing the other one stall on small products.
        ref.blas_threads = max(1, (self.backend.threads or 1) - 1)
        self.say(f"kernel backend: {ref.choice}")
        model = LlamaModel(self.loaded.config, self.loaded.weights, ref)
        return model, ref.check_routes()

    def start(self) -> None:
        """Begin the background build."""
        self.state.started = time.monotonic()
        self._thread = threading.Thread(target=self._build, name="forge-compile", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop a compile still running (the server is stopping)."""
        self._closed = True
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()

    @property
    def ready(self) -> bool:
        return self._result is not None

    def take(self) -> tuple[LlamaModel, list[RouteCheck]]:
        """The numba model and its gate checks (once `ready`); the swap is then done."""
        assert self._result is not None
        result, self._result = self._result, None
        self.state.phase = "done"
        return result

    def info(self) -> dict[str, Any]:
        """The build's state for /admin and /ready."""
        s = self.state
        took = s.seconds if s.seconds is not None else time.monotonic() - s.started
        return {
            "phase": s.phase,
            "step": s.step,
            "steps": s.steps,
            "stage": s.stage,
            "seconds": round(took, 1),
            "error": s.error,
        }

    def _progress(self, i: int, n: int, what: str) -> None:
        self.state.step, self.state.steps, self.state.stage = i, n, what
        self.say(f"compiling CPU kernels {i}/{n} ({what}) in the background ...")

    def _build(self) -> None:
        be = self.backend
        try:
            self._compile_apart()
            if self._closed:
                return
            self.state.stage = "loading the compiled kernels"
            # This thread's kernels run on it alone: only the step thread leads a team of kernel threads.
            be.bind_loading_thread()
            model = LlamaModel(self.loaded.config, self.loaded.weights, be, take=True)
            be.warm_up()  # from the cache now; compiles here whatever the separate process did not
            routes = be.check_routes()
            for check in routes:
                (self.say if check.ok else log.warning)(f"kernel route {check}")
            compile_stamp.mark_compiled(self.key)
        except Exception as exc:  # the reference serves on: slower, still correct
            log.exception("compiling the CPU kernels failed; the float32 reference keeps serving")
            self.state.phase, self.state.error = "failed", f"{type(exc).__name__}: {exc}"
            self.state.seconds = time.monotonic() - self.state.started
            return
        self.state.seconds = time.monotonic() - self.state.started
        self.state.stage = "ready"
        self.state.phase = "ready"
        self.say(f"CPU kernels ready in {self.state.seconds:.1f}s; switching from the reference at the next step")
        self._result = (model, routes)

    def _compile_apart(self) -> None:
        """Compile into numba's disk cache in a child process (engine/compile_kernels.py), passing on its progress.
        A failure there is logged only: the build in this process compiles what is missing."""
        cmd = [sys.executable, "-m", "engine.compile_kernels", os.path.abspath(self.loaded.path)]
        cmd += ["--parent", str(os.getpid())]
        cmd += ["--activations", getattr(self.backend, "activations", "f32")]
        if self.quantize:
            cmd += ["--quantize", self.quantize]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, env.get("PYTHONPATH")) if p)
        with tempfile.TemporaryFile() as err:
            self._proc = proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, env=env, text=True)
            if self._closed:
                proc.terminate()
            assert proc.stdout is not None
            for line in proc.stdout:
                parts = line.rstrip("\n").split(" ", 2)
                if len(parts) == 3 and parts[0].isdigit() and parts[1].isdigit():
                    self._progress(int(parts[0]), int(parts[1]), parts[2])
            if proc.wait() != 0 and not self._closed:
                err.seek(0)
                tail = err.read()[-2000:].decode(errors="replace")
                log.warning("compiling the kernels in a child process failed (exit %d): %s", proc.returncode, tail)
