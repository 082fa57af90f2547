"""Which kernel a matrix product runs: a value computed from the weight's form, the activation rows, the CPU's
capabilities (kernels/cpu.py) and the activation mode. `NumbaBackend.linear` only dispatches on it; the tests
and the start-up gate (kernels/gate.py) read it to know what they check.

The policy, in order:
- float32 weights: OpenBLAS (`blas`); float16/bfloat16 weights: dequantized panels + OpenBLAS (`panels`);
- q4 weights on AVX-512 VNNI without AMX are blocked sixteen rows at a time and every product of theirs runs on
  the sixteen-row kernels (`x16_i8` with int8 activations, else `x16_split`: float32 activations as four int8
  pieces, float32 precision);
- int8 activations (`--activations q8`) over groups of 32: the int8 kernels (`matvec_i8`), prompts included; on
  AMX, products of more than INT8_AMX_MAX_ROWS rows over float16 scales run on its int8 tiles (`amx_i8`);
- AMX CPUs: products of AMX_MIN_ROWS rows or more over weights with groups of 32 and float16 scales
  (`amx_tiles`, exact to float32 rounding);
- more than MATVEC_MAX_ROWS rows: `panels`;
- otherwise the matrix-vector kernels: q4 as int8 pieces on AVX-512 VNNI (`matvec_q4_split`), else `matvec_q4`;
  q8 weights `matvec_q8`.
"""

from __future__ import annotations

from dataclasses import dataclass

from kernels.cpu import CpuCaps

# Activation rows up to which products read the quantized weight directly (above: panels + BLAS).
# The matvec kernels cost about linearly in rows (tiles share each weight group's unpacking); the
# panels pay a fixed dequantization per call and then run at BLAS speed, so they win from some row
# count on; `scripts/matvec_bench.py --rows` measures where (docs/performance.md has the figures).
MATVEC_MAX_ROWS = 40
# Products of at least this many rows run on AMX tiles where the CPU has them (kernels/numba_amx.py;
# weights with groups of 32 and float16 scales: GGUF Q4_0, Q4_1, Q8_0). A tile holds 16 activation
# rows: with fewer than about 12 the tile's unused rows cost as much as the matvec kernels' work, so
# those keep the smaller products (`scripts/matvec_bench.py --rows` on an AMX CPU finds the crossing).
AMX_MIN_ROWS = 12
# With int8 activations on AMX, products of up to this many rows keep the int8 matrix-vector kernels and more run on
# the int8 tiles (kernels/numba_amx_i8.py): a crossing to measure on an AMX CPU, as AMX_MIN_ROWS is.
INT8_AMX_MAX_ROWS = 32
# Row counts where some route changes: one of each class of product a model runs (the start-up gate's probes).
ROW_CLASSES = (1, AMX_MIN_ROWS, INT8_AMX_MAX_ROWS + 1, MATVEC_MAX_ROWS + 1)

# What each kernel needs of the CPU to run at all (a route that is chosen nowhere else may still run elsewhere:
# the four-row pieces kernel is plain vector code, taken only where it wins).
NEEDS = {
    "x16_i8": CpuCaps(vnni512=True),
    "x16_split": CpuCaps(vnni512=True),
    "amx_tiles": CpuCaps(amx=True),
    "amx_i8": CpuCaps(amx=True),
}
BLOCKED_KERNELS = (
    "matvec_q4",
    "matvec_q4_split",
    "matvec_q8",
    "matvec_i8",
    "x16_i8",
    "x16_split",
    "amx_tiles",
    "amx_i8",
)


@dataclass(frozen=True, slots=True)
class Form:
    """What a prepared weight looks like to the routes: its kind ("q4", "q8", "f32", "f16", "bf16"), and for
    q4/q8 its group, whether its scales are held as float16 (`half`), rows per block (`stripe`: 4 or 16), whether
    it has mins and its zero point (8: GGUF Q4_0)."""

    kind: str
    group: int = 0
    half: bool = False
    stripe: int = 0
    has_min: bool = False
    zero: int = 0

    @property
    def label(self) -> str:
        if not self.stripe:
            return self.kind
        parts = [self.kind, f"g{self.group}", "f16 scales" if self.half else "f32 scales", f"{self.stripe}-row"]
        return " ".join(parts + (["min"] if self.has_min else []) + ([f"zero {self.zero}"] if self.zero else []))


@dataclass(frozen=True, slots=True)
class Route:
    """A product's kernel, the form its activations take ("f32"; "int8": quantized per 32-block, the int8 model;
    "pieces": float32 split into int8 pieces, float32 precision) and the weight layout it reads (rows per block;
    0: unblocked)."""

    kernel: str
    activations: str = "f32"
    stripe: int = 0

    @property
    def int8(self) -> bool:
        """Whether the product's activations are rounded to int8 (expect the int8 model, not the exact product)."""
        return self.activations == "int8"

    @property
    def needs(self) -> CpuCaps:
        return NEEDS.get(self.kernel, CpuCaps())

    def __str__(self) -> str:
        return f"{self.kernel} ({self.activations})"


def stripe_for(kind: str, caps: CpuCaps) -> int:
    """Rows per block of a weight of `kind` on a CPU with `caps` (0: not blocked)."""
    if kind not in ("q4", "q8"):
        return 0
    return 16 if kind == "q4" and caps.vnni512 and not caps.amx else 4


def route(rows: int, form: Form, caps: CpuCaps, activations: str = "f32") -> Route:
    """The route of a product of `rows` activation rows with a weight of `form` (the module docstring's policy)."""
    if form.kind == "f32":
        return Route("blas")
    if not form.stripe:
        return Route("panels")
    amx = caps.amx and rows >= AMX_MIN_ROWS and form.group == 32 and form.half
    int8 = activations == "q8" and form.group == 32
    if form.stripe == 16:
        return Route("x16_i8", "int8", 16) if int8 else Route("x16_split", "pieces", 16)
    if int8:
        return Route("amx_i8", "int8", 4) if amx and rows > INT8_AMX_MAX_ROWS else Route("matvec_i8", "int8", 4)
    if amx:
        return Route("amx_tiles", "f32", 4)
    if rows > MATVEC_MAX_ROWS:
        return Route("panels", "f32", 4)
    if form.kind == "q4":
        return Route("matvec_q4_split", "pieces", 4) if caps.vnni512 else Route("matvec_q4", "f32", 4)
    return Route("matvec_q8", "f32", 4)


def fallback(r: Route) -> Route | None:
    """The route that replaces `r` when `r` fails its check: the plain four-row kernel for the pieces one, the
    float tiles for the int8 ones, else the dequantized panels, which read every layout (None: nothing is left
    below the panels and BLAS)."""
    if r.kernel == "matvec_q4_split":
        return Route("matvec_q4", "f32", r.stripe)
    if r.kernel == "amx_i8":
        return Route("amx_tiles", "f32", r.stripe)
    if r.kernel in ("panels", "blas"):
        return None
    return Route("panels", "f32", r.stripe)


# Row counts on each side of every boundary above, and a long prompt's: the route table's columns.
TABLE_ROWS = (
    1,
    AMX_MIN_ROWS - 1,
    AMX_MIN_ROWS,
    INT8_AMX_MAX_ROWS,
    INT8_AMX_MAX_ROWS + 1,
    MATVEC_MAX_ROWS,
    MATVEC_MAX_ROWS + 1,
    512,
)


def gguf_forms(caps: CpuCaps) -> dict[str, Form]:
    """The forms GGUF's types take on a CPU: Q4_0/Q4_1/Q8_0 keep float16 scales where F16C converts them; Q4_K's
    and Q6_K's scales are products that float16 does not hold (float32); F16/BF16/F32 stay unblocked."""
    q4, q8 = stripe_for("q4", caps), stripe_for("q8", caps)
    return {
        "Q4_0": Form("q4", 32, caps.f16c, q4, False, 8),
        "Q4_1": Form("q4", 32, caps.f16c, q4, True),
        "Q8_0": Form("q8", 32, caps.f16c, q8),
        "Q4_K": Form("q4", 32, False, q4, True),
        "Q6_K": Form("q8", 16, False, q8),
        "F16": Form("f16"),
        "BF16": Form("bf16"),
        "F32": Form("f32"),
    }


def table(caps: CpuCaps, activations: str, rows: tuple[int, ...] = TABLE_ROWS) -> dict[str, list[Route]]:
    """Each GGUF type's route at each row count, on a CPU with `caps`."""
    return {name: [route(n, form, caps, activations) for n in rows] for name, form in gguf_forms(caps).items()}
