"""cuBLAS products of the CuPy backend: float16 inputs, float32 accumulation and result.

cupy.matmul of float16 arrays would round the result to float16, so the backend calls cuBLAS's GemmEx itself.
Importing this module needs neither CuPy nor a GPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# cuBLAS reads alpha and beta from the host (its default pointer mode).
_ONE, _ZERO = np.ones((), np.float32), np.zeros((), np.float32)


def gemm_f16(cp: Any, x16: Any, w16: Any, out: Any) -> None:
    """out [T, n] = x16 [T, K] @ w16 [n, K].T on the current stream: float16 in, float32 accumulated and written.
    `out` may be a column slice of a wider float32 matrix."""
    (T, K), n = x16.shape, w16.shape[0]
    if T == 0:
        return
    cublas, runtime = cp.cuda.cublas, cp.cuda.runtime
    # cuBLAS is column-major: the row-major out [T, n] is a column-major [n, T] matrix whose leading
    # dimension is out's row stride, and it equals w16 (column-major [K, n], transposed) times x16 ([K, T]).
    cublas.gemmEx(
        cp.cuda.get_cublas_handle(),
        cublas.CUBLAS_OP_T,
        cublas.CUBLAS_OP_N,
        n,
        T,
        K,
        _ONE.ctypes.data,
        w16.data.ptr,
        runtime.CUDA_R_16F,
        K,
        x16.data.ptr,
        runtime.CUDA_R_16F,
        K,
        _ZERO.ctypes.data,
        out.data.ptr,
        runtime.CUDA_R_32F,
        out.strides[0] // 4,
        cublas.CUBLAS_COMPUTE_32F,
        cublas.CUBLAS_GEMM_DEFAULT_TENSOR_OP,
    )
