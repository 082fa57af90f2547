"""Memory-mapped safetensors reading, BF16 included.

safetensors' own `safe_open(framework="numpy")` cannot return BF16 (NumPy has no bfloat16),
and most HF Llama checkpoints are BF16, so the format (8-byte header length, JSON header,
raw little-endian data) is read directly.
"""

from __future__ import annotations

import json
import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engine.loader.errors import ModelLoadError
from kernels.weight import Weight

_DTYPES: dict[str, np.dtype] = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2")}
_ITEMSIZE = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "U16": 2,
    "U32": 4,
    "U64": 8,
}


@dataclass(slots=True)
class SafeTensor:
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute byte offsets in the file
    end: int


@dataclass(slots=True)
class SafetensorsFile:
    path: Path
    tensors: dict[str, SafeTensor]
    _buf: Any = field(default=None, repr=False)

    def get(self, name: str) -> np.ndarray:
        """The tensor as a new float32 C-contiguous array (F32, F16 and BF16 only)."""
        t = self.tensors[name]
        if t.dtype not in _DTYPES:
            raise ModelLoadError(
                f"{self.path}: tensor {name!r} has unsupported dtype {t.dtype} (supported: F32, F16, BF16)"
            )
        count = int(np.prod(t.shape, dtype=np.int64))
        raw = np.frombuffer(self._buf, dtype=_DTYPES[t.dtype], count=count, offset=t.start)
        if t.dtype == "BF16":
            return (raw.astype(np.uint32) << np.uint32(16)).view(np.float32).reshape(t.shape)
        return raw.astype(np.float32).reshape(t.shape)

    def weight(self, name: str) -> Weight:
        """A 2-D tensor as a Weight of its own precision (F32, F16, BF16), copied out of the mapping."""
        t = self.tensors[name]
        if t.dtype not in _DTYPES:
            raise ModelLoadError(
                f"{self.path}: tensor {name!r} has unsupported dtype {t.dtype} (supported: F32, F16, BF16)"
            )
        count = int(np.prod(t.shape, dtype=np.int64))
        raw = np.frombuffer(self._buf, dtype=_DTYPES[t.dtype], count=count, offset=t.start).reshape(t.shape)
        return Weight(t.dtype.lower(), raw.copy())


def read_safetensors(path: str | Path) -> SafetensorsFile:
    """Parse the header and map the file. Raises ModelLoadError for a non-safetensors or truncated file."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            size = f.seek(0, 2)
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
    except OSError as exc:
        raise ModelLoadError(f"cannot read {path}: {exc}") from exc
    if len(head) < 8:
        raise ModelLoadError(f"{path} is not a safetensors file (only {size} bytes)")
    (n,) = struct.unpack("<Q", head)
    if n > size - 8 or n > 100_000_000:
        raise ModelLoadError(f"{path} is not a safetensors file or is truncated (header length {n}, file {size} bytes)")
    try:
        header = json.loads(bytes(buf[8 : 8 + n]).decode("utf-8"))
        assert isinstance(header, dict)
    except (ValueError, AssertionError) as exc:
        raise ModelLoadError(f"{path} is not a safetensors file (header is not JSON)") from exc
    base = 8 + n
    tensors: dict[str, SafeTensor] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (start, end) = info["dtype"], tuple(int(d) for d in info["shape"]), info["data_offsets"]
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelLoadError(f"{path}: malformed header entry for {name!r}") from exc
        count = int(np.prod(shape, dtype=np.int64))
        if dtype in _ITEMSIZE and end - start != count * _ITEMSIZE[dtype]:
            raise ModelLoadError(f"{path}: tensor {name!r} has {end - start} bytes for {dtype} shape {shape}")
        if base + end > size:
            raise ModelLoadError(
                f"{path}: safetensors file is truncated: tensor {name!r} ends at byte {base + end}, file has {size}"
            )
        tensors[name] = SafeTensor(dtype, shape, base + start, base + end)
    return SafetensorsFile(path, tensors, buf)
