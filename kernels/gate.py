"""The start-up parity gate: before a backend serves, each matrix-product route it will use runs once on small
shapes against the NumPy reference (kernels/reference.py). Milliseconds: the kernels are compiled by then.

- numba (`check_numba_routes`): every route the prepared weights' forms take over the row classes a model
  runs (kernels/routes.py ROW_CLASSES). A kernel that fails is retired: its products take the next route
  (routes.fallback), which is checked in turn, and a warning names both.
- any other backend (`check_products`): its products over the GGUF weight kinds Forge serves, at decode, batch
  and prompt row counts. `kernels.get_backend` does not choose a GPU whose products fail.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from kernels.reference import exact_product, int8_product
from kernels.routes import ROW_CLASSES, Form, Route
from kernels.weight import Weight, pack_q4

if TYPE_CHECKING:
    from kernels.numba_backend import NumbaBackend

log = logging.getLogger("forge.kernels")

# Largest error a route may show, relative to the largest value of the exact product: float32 sums of 128
# terms sit near 1e-7; a wrong kernel (a misread group, a lost min, a stale scale) is off by 1e-2 or more.
BOUND = 1e-5
# The GPU's products: float32 sums in another order (and float16 activations where its kernels take them).
GPU_BOUND = 2e-3
N, K = 37, 128  # weight rows ragged against blocks of 4 and 16; four groups of 32, eight of 16


@dataclass(frozen=True, slots=True)
class RouteCheck:
    """One route's check: the weight form and row count it ran, its error against the reference (relative to the
    exact product's largest value), and for a failed route, the one that replaced it (None: none is left)."""

    form: str
    rows: int
    route: str
    ok: bool
    error: float
    bound: float
    replaced_by: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        verdict = "ok" if self.ok else f"FAILED, replaced by {self.replaced_by}"
        return f"{self.form}, {self.rows} rows: {self.route} {verdict} (error {self.error:.1e})"


def sample_weight(form: Form, rng: np.random.Generator, n: int = N, k: int = K) -> Weight:
    """A random weight of `form` (values over the kind's whole range; scales that float16 holds exactly where the
    form keeps float16 scales, others where it does not)."""
    if form.kind in ("f32", "f16", "bf16"):
        x = rng.standard_normal((n, k)).astype(np.float32)
        data: dict[str, np.ndarray] = {
            "f32": x,
            "f16": x.astype(np.float16),
            "bf16": (x.view(np.uint32) >> 16).astype(np.uint16),
        }
        return Weight(form.kind, data[form.kind])

    def scales(lo: float, hi: float) -> np.ndarray:
        s = rng.uniform(lo, hi, (n, k // form.group)).astype(np.float32)
        return s.astype(np.float16).astype(np.float32) if form.half else s

    if form.kind == "q4":
        q = pack_q4(rng.integers(0, 16, (n, k), dtype=np.uint8))
        if form.zero:
            return Weight("q4", q, scales(0.01, 0.1), None, form.group, zero=form.zero)
        return Weight("q4", q, scales(0.01, 0.1), scales(-0.5, 0.5) if form.has_min else None, form.group)
    mins = scales(-0.5, 0.5) if form.has_min else None
    return Weight("q8", rng.integers(-128, 128, (n, k), dtype=np.int8), scales(0.01, 0.1), mins, form.group)


def sample_activations(rng: np.random.Generator, rows: int, k: int = K) -> np.ndarray:
    """Rows of different magnitudes, and a block of zeros (an int8 block whose scale is 0)."""
    x = (rng.standard_normal((rows, k)) * rng.uniform(0.1, 10, (rows, 1))).astype(np.float32)
    x[0, :32] = 0
    return x


def _error(got: np.ndarray, want: np.ndarray, exact: np.ndarray) -> float:
    if got.shape != want.shape or not np.isfinite(got).all():
        return float("inf")
    return float(np.abs(got - want).max() / max(np.abs(exact).max(), 1e-30))


def check_numba_routes(be: NumbaBackend) -> list[RouteCheck]:
    """Check every route `be`'s prepared weight forms take; retire a kernel that fails (see the module docstring).
    Raises RuntimeError when a form has no route left."""
    rng = np.random.default_rng(0)
    checks: list[RouteCheck] = []
    done: set[tuple[Form, Route]] = set()
    for form in sorted(be.forms, key=lambda f: f.label):
        w = sample_weight(form, rng)
        lin = be.prepare_linear(w)
        assert lin.form == form, (lin.form, form)
        for rows in ROW_CLASSES:
            x = sample_activations(rng, rows)
            exact = exact_product(x, w)
            while (form, r := be.route(rows, lin)) not in done:
                done.add((form, r))
                try:
                    err = _error(be.linear(x, lin, route=r), int8_product(x, w) if r.int8 else exact, exact)
                except Exception as e:  # a kernel that raises fails its check like one that computes wrong
                    log.warning("kernel route %s raised %s: %s", r, type(e).__name__, e)
                    err = float("inf")
                if err <= BOUND:
                    checks.append(RouteCheck(form.label, rows, str(r), True, err, BOUND))
                    break
                be.retire(r.kernel, f"{form.label}, {rows} rows: error {err:.1e} > {BOUND:.0e}")
                try:
                    nxt: str | None = str(be.route(rows, lin))
                except RuntimeError:
                    nxt = None
                checks.append(RouteCheck(form.label, rows, str(r), False, err, BOUND, nxt))
                log.warning("kernel route %s failed its check (%s); using %s instead", r, be.retired[r.kernel], nxt)
                if nxt is None:
                    raise RuntimeError(f"no kernel route left for {form.label} products: {be.retired}")
    return checks


class ProductBackend(Protocol):
    """What `check_products` needs of a backend (kernels.Backend has it; the package imports this module)."""

    name: str

    def prepare_linear(self, w: Weight) -> Any: ...
    def linear(self, x: Any, w: Any, bias: Any = None) -> Any: ...
    def asarray(self, a: Any, dtype: Any = None) -> Any: ...
    def to_numpy(self, a: Any) -> np.ndarray: ...


# The weight kinds a GPU backend is checked on: GGUF Q4_0, Q4_1, Q8_0 (float16 scales) and F16.
GPU_FORMS = (
    Form("q4", 32, True, 4, False, 8),
    Form("q4", 32, True, 4, True),
    Form("q8", 32, True, 4),
    Form("f16"),
)
GPU_ROWS = (1, 8, 41)


def check_products(backend: ProductBackend, bound: float = GPU_BOUND) -> list[RouteCheck]:
    """A backend's `linear` over GPU_FORMS at GPU_ROWS rows against the exact product (nothing retired: the
    caller decides what a failure means)."""
    rng = np.random.default_rng(0)
    checks: list[RouteCheck] = []
    for form in GPU_FORMS:
        w = sample_weight(form, rng)
        lin = backend.prepare_linear(w)
        for rows in GPU_ROWS:
            x = sample_activations(rng, rows)
            exact = exact_product(x, w)
            try:
                got = backend.to_numpy(backend.linear(backend.asarray(x), lin))
                err = _error(np.asarray(got, dtype=np.float64), exact, exact)
            except Exception as e:
                log.warning("%s products of %s raised %s: %s", backend.name, form.label, type(e).__name__, e)
                err = float("inf")
            checks.append(RouteCheck(form.label, rows, f"{backend.name} linear", err <= bound, err, bound))
    return checks
