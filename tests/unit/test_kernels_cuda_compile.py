"""Every CUDA source under kernels/cuda compiles under NVRTC (no GPU needed: PTX for compute_90)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from kernels import nvrtc

pytestmark = pytest.mark.skipif(
    not nvrtc.available(), reason="the nvidia-cuda-nvrtc-cu12 wheel (libnvrtc.so.12) is not installed"
)

SOURCES = nvrtc.cuda_sources()
# Kernels the CuPy backend looks up by name: each must exist as extern "C" in its file.
EXPECTED_KERNELS = {
    "rms_norm.cu": ["rms_norm_f32", "add_rms_norm_f32"],
    "rope.cu": ["rope_neox_f32"],
    "silu_mul.cu": ["silu_mul_f32"],
    "kv_cache.cu": ["write_kv_f32"],
    "paged_attention.cu": ["paged_attention_f32"],
    "token_bitmask.cu": ["apply_token_bitmask_f32"],
}


def test_every_expected_source_is_there():
    assert sorted(p.name for p in SOURCES) == sorted(EXPECTED_KERNELS)


@pytest.mark.parametrize("path", SOURCES, ids=[p.name for p in SOURCES])
def test_source_compiles(path):
    nvrtc.compile_check(path)
    for kernel in EXPECTED_KERNELS[path.name]:
        assert re.search(rf'extern "C" __global__ void {kernel}\(', path.read_text()), f"{kernel} missing in {path.name}"


def test_kernel_names_match_the_backend():
    from kernels import cupy_backend

    used = set(re.findall(r'_kernel\("([\w.]+)", "(\w+)"\)', Path(cupy_backend.__file__).read_text()))
    expected = {(f, k) for f, ks in EXPECTED_KERNELS.items() for k in ks}
    assert used == expected


def test_broken_source_fails_with_the_log(tmp_path):
    bad = tmp_path / "broken.cu"
    # NVRTC has no INFINITY macro (system nvcc accepts it): the kind of thing this check exists to catch.
    bad.write_text('extern "C" __global__ void f(float* x) { x[threadIdx.x] = INFINITY; }\n')
    with pytest.raises(nvrtc.CompileError) as err:
        nvrtc.compile_check(bad)
    assert 'identifier "INFINITY" is undefined' in err.value.log
    assert "broken.cu" in str(err.value)


def test_headers_from_the_runtime_wheel_are_found():
    nvrtc.compile_source(
        '#include <cuda_fp16.h>\nextern "C" __global__ void h(__half* x) { x[0] = __float2half(1.0f); }\n', "half.cu"
    )


def test_missing_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.cu"):
        nvrtc.compile_check(tmp_path / "nope.cu")
