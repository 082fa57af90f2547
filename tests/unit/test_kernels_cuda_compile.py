"""Every CUDA source under kernels/cuda compiles under NVRTC for the GPUs Forge targets (sm_80, sm_90),
with no register spills, and defines exactly the kernels the CuPy backend launches. No GPU needed."""

from __future__ import annotations

import re

import pytest

from kernels import nvrtc
from kernels.cupy_backend import KERNELS

pytestmark = pytest.mark.skipif(
    not nvrtc.available(), reason="the nvidia-cuda-nvrtc-cu12 wheel (libnvrtc.so.12) is not installed"
)

SOURCES = nvrtc.cuda_sources()


@pytest.mark.parametrize("arch", nvrtc.ARCHS)
@pytest.mark.parametrize("path", SOURCES, ids=[p.name for p in SOURCES])
def test_source_compiles_without_spills(path, arch):
    log = nvrtc.compile_check(path, arch, ("--ptxas-options=-v",))
    spills = re.findall(r"(\d+) bytes spill stores", log)
    assert len(spills) == len(re.findall(r'extern "C" __global__', path.read_text())), log
    assert set(spills) == {"0"}, f"{path.name} spills registers on {arch}:\n{log}"


def test_the_backend_launches_exactly_the_kernels_the_sources_define():
    defined = {(p.name, k) for p in SOURCES for k in re.findall(r'extern "C" __global__ void (\w+)\(', p.read_text())}
    assert {(file, name) for name, file in KERNELS.items()} == defined


def test_broken_source_fails_with_the_log(tmp_path):
    bad = tmp_path / "broken.cu"
    # NVRTC has no INFINITY macro (system nvcc accepts it): the kind of thing this check exists to catch.
    bad.write_text('extern "C" __global__ void f(float* x) { x[threadIdx.x] = INFINITY; }\n')
    with pytest.raises(nvrtc.CompileError) as err:
        nvrtc.compile_check(bad)
    assert 'identifier "INFINITY" is undefined' in err.value.log
    assert "broken.cu" in str(err.value)


def test_too_much_shared_memory_fails_on_a_real_architecture():
    # ptxas runs for sm_XX targets: resource limits are checked, not just syntax.
    src = 'extern "C" __global__ void f(float* x) { __shared__ float s[16384]; s[threadIdx.x] = 1; x[0] = s[(int)x[1]]; }\n'  # noqa: E501
    with pytest.raises(nvrtc.CompileError, match="shared data"):
        nvrtc.compile_source(src, "big.cu", "sm_80")


def test_headers_from_the_runtime_wheel_are_found():
    nvrtc.compile_source(
        '#include <cuda_fp16.h>\nextern "C" __global__ void h(__half* x) { x[0] = __float2half(1.0f); }\n', "half.cu"
    )


def test_missing_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.cu"):
        nvrtc.compile_check(tmp_path / "nope.cu")
