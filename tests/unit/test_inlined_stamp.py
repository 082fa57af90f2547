"""numba stamps a cached kernel with its own source file only; kernels/numba_jit.py's `_INLINED` adds the modules
whose numba code other files' kernels compile in (the SIMD blocks, inlined helpers). A module missing from it
leaves cached machine code stale after a change to that module alone: every module of numba code that another
module of numba code imports must be listed."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from kernels import numba_jit

KERNELS = Path(numba_jit.__file__).resolve().parent
MARKERS = ("@njit", "@intrinsic", "intrinsic(", "register_model")  # numba code: kernels, blocks, vector types
# numba_jit.py holds the compile options and this stamp, not code compiled into a kernel.
NOT_CODE = {"numba_jit.py"}


def is_numba_code(source: str) -> bool:
    return any(m in source for m in MARKERS)


def unstamped(sources: dict[str, str], inlined: tuple[str, ...]) -> list[str]:
    """The modules (file names in `sources`: name -> text) of numba code that another module of numba code imports
    and `inlined` does not list."""
    code = {name for name, src in sources.items() if is_numba_code(src) and name not in NOT_CODE}
    used = set()
    for name in code:
        for mod in re.findall(r"^from kernels\.(\w+) import", sources[name], re.M):
            used.add(mod + ".py")
    return sorted((used & code) - set(inlined))


def test_every_module_compiled_into_other_kernels_is_in_the_stamp() -> None:
    sources = {p.name: p.read_text(encoding="utf-8") for p in KERNELS.glob("*.py")}
    assert unstamped(sources, numba_jit._INLINED) == []
    assert all(name in sources for name in numba_jit._INLINED)


def test_the_guard_sees_a_planted_module() -> None:
    block = "from numba.extending import intrinsic\n\n@intrinsic\ndef f(typingctx):\n    pass\n"
    kernel = "from kernels.simd_new import f\n\n@njit\ndef k():\n    f()\n"
    sources = {"simd_new.py": block, "numba_k.py": kernel}
    assert unstamped(sources, ()) == ["simd_new.py"]
    assert unstamped(sources, ("simd_new.py",)) == []


def test_the_stamp_changes_with_an_inlined_module_or_the_compile_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A kernel's machine code follows its compile options (JIT, JIT_EXACT) as much as its source: an upgrade that
    # changed only those must not load the old code from the cache.
    for name in (*numba_jit._INLINED, "numba_jit.py"):
        shutil.copy(KERNELS / name, tmp_path / name)
    monkeypatch.setattr(numba_jit, "_HERE", str(tmp_path))
    before = numba_jit._inlined_digest()
    for name, old, new in (("numba_jit.py", "nogil=True)", "nogil=False)"), ("simd.py", "\n", "\n\n")):
        path = tmp_path / name
        text = path.read_text(encoding="utf-8")
        assert old in text
        path.write_text(text.replace(old, new, 1), encoding="utf-8")
        assert numba_jit._inlined_digest() != before, name
        before = numba_jit._inlined_digest()
