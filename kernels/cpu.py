"""What a CPU offers the numba kernels, as a value: detected once from the CPU numba compiles for, or built by
hand (the route table's tests simulate CPUs this one is not).

Only the capabilities that change which kernel a product takes are here (kernels/routes.py). The width of the
float blocks and the encoding of the integer dot products (zmm, ymm, AVX2's two-instruction form) follow the
compile target inside the same kernels (kernels/simd.py) and change no route.
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True, slots=True)
class CpuCaps:
    """`f16c`: float16 conversions (weights keep GGUF's float16 scales); `vnni512`: AVX-512 VNNI + BW
    (`vpdpbusd` on zmm: the sixteen-row q4 kernels); `amx`: AMX tiles granted to this process."""

    f16c: bool = False
    vnni512: bool = False
    amx: bool = False

    @classmethod
    def detect(cls) -> CpuCaps:
        """This process's: the CPU numba compiles for (the host unless NUMBA_CPU_NAME says otherwise)."""
        from kernels import simd_amx  # imports numba: only when a backend is built
        from kernels.simd import VNNI512, target_has

        return cls(f16c=target_has("f16c"), vnni512=VNNI512, amx=simd_amx.available())

    def within(self, other: CpuCaps) -> bool:
        """Whether every capability this one has, `other` has too (its kernels run on `other`)."""
        return all(getattr(other, f.name) for f in fields(self) if getattr(self, f.name))

    def missing(self, other: CpuCaps) -> list[str]:
        """The capabilities this one has and `other` lacks."""
        return [f.name for f in fields(self) if getattr(self, f.name) and not getattr(other, f.name)]

    @property
    def label(self) -> str:
        """A short name: the widest of AMX, AVX-512 VNNI, AVX2, with or without F16C."""
        isa = "amx" if self.amx else "avx512-vnni" if self.vnni512 else "avx2"
        return isa + ("" if self.f16c else " (no f16c)")


# The CPU kinds the route table is written for (tests/unit/test_kernel_routes.py).
SIMULATED = {
    "avx2": CpuCaps(f16c=True),
    "avx2-no-f16c": CpuCaps(),
    "avx512-vnni": CpuCaps(f16c=True, vnni512=True),
    "amx": CpuCaps(f16c=True, vnni512=True, amx=True),
}
