"""A float32 `exp` that LLVM vectorizes: `math.exp` stays a scalar library call in numba's code
(no vector math library), which made it the cost of SiLU and the softmax.

`exp32(x)`: Cody-Waite range reduction x = n ln2 + r, |r| <= ln2 / 2, Cephes' degree-6 minimax
polynomial for e^r, and 2^n built from its exponent bits. Inlined into the caller, so it takes the
caller's fast-math flags: under the shared ones (reassociation) the relative error stays below
4e-7, a few float32 ulps, on [-87, 88]. Arguments outside are clamped there (exp(88) = 1.7e38 is
still finite, exp(-87) = 1.6e-38 still a normal number).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from kernels.numba_jit import JIT

f32 = np.float32

LOG2E = f32(1.4426950408889634)
LN2_HI = f32(0.693359375)  # exact in 9 bits, so n * LN2_HI is exact
LN2_LO = f32(-2.12194440e-4)


@intrinsic
def _bits_to_f32(typingctx, bits):
    """The float32 whose IEEE bits are the int32 `bits`."""
    if bits != types.int32:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.int32), codegen


@njit(inline="always", **JIT)
def exp32(x: float | np.float32) -> float:
    """e**x in float32 (see the module docstring for range and accuracy)."""
    x = min(max(f32(x), f32(-87.0)), f32(88.0))
    n = np.floor(x * LOG2E + f32(0.5))
    r = x - n * LN2_HI - n * LN2_LO
    p = f32(1.9875691500e-4)
    p = p * r + f32(1.3981999507e-3)
    p = p * r + f32(8.3334519073e-3)
    p = p * r + f32(4.1665795894e-2)
    p = p * r + f32(1.6666665459e-1)
    p = p * r + f32(5.0000001201e-1)
    p = p * r * r + r + f32(1.0)
    return p * _bits_to_f32(np.int32((np.int32(n) + 127) << 23))
