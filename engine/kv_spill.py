"""The KV spill tier: full blocks the prefix cache evicts go to a bounded directory of block files, and a later prompt
that misses them in memory reads them back instead of recomputing them.

Files are keyed by the blocks' chain digests (engine/kv_spill_file.py) in a folder named for the model and KV
layout, so another model's or backend's files are never read. The step thread only hands over a host copy of an
evicted block (`offer`); a writer thread writes it (temp file + rename) and keeps the folder within its byte budget,
least recently used first. `restore` runs on the step thread: cheaper than the prefill it replaces. A block still
waiting for the writer is restored from its copy. The index is rebuilt from the folder at start (ordered by
modification time, which a restore refreshes), so files survive a restart. Processes sharing a folder (replicas on
one machine) share its files, every read checked as always, but each counts the budget for the files it knows.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from engine import kv_spill_file as fmt

if TYPE_CHECKING:
    from engine.loader import LoadedModel
    from engine.model_runner import ModelRunner

log = logging.getLogger("forge.engine")

MAX_PENDING_BYTES = 256 << 20  # copies waiting for the writer; past this, evicted blocks are dropped, not queued
STALE_TMP_S = 3600.0  # a temp file this old is an interrupted write's leftover


@dataclass(slots=True)
class SpillStats:
    spilled_blocks: int = 0  # written to disk
    spilled_bytes: int = 0
    restored_blocks: int = 0  # read back into the KV cache
    restored_bytes: int = 0
    lookups: int = 0  # blocks missing from memory looked up here
    discarded: int = 0  # files refused on reading (corrupt, truncated, another block): recomputed instead
    dropped: int = 0  # evicted blocks not spilled because the writer was behind
    write_errors: int = 0
    restore_s: float = 0.0


class KVSpill:
    """The spill tier of one engine. `read_block(bid)` returns a host copy of a block's K/V (every layer);
    `write_block(bid, data)` puts such a copy back into the KV cache."""

    def __init__(
        self,
        directory: str | os.PathLike,
        capacity: int,
        layout: str,
        block_shape: tuple[int, ...],
        dtype: np.dtype,
        read_block: Callable[[int], np.ndarray],
        write_block: Callable[[int, np.ndarray], None],
    ) -> None:
        self.shape, self.dtype = tuple(block_shape), np.dtype(dtype)
        self.payload_bytes = int(np.prod(self.shape)) * self.dtype.itemsize
        self.capacity = capacity
        self.layout = fmt.layout_digest(layout)
        name = re.sub(r"[^A-Za-z0-9._-]+", "_", layout.split("|", 1)[0])[:48]
        self.dir = Path(directory) / f"{name}-{self.layout.hex()[:16]}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self._read_block, self._write_block = read_block, write_block
        self.stats = SpillStats()
        self._lock = threading.Lock()
        self._index: OrderedDict[bytes, int] = OrderedDict()  # digest -> file bytes, least recently used first
        self._bytes = 0
        self._pending: dict[bytes, tuple[tuple[int, ...], np.ndarray]] = {}
        self._pending_bytes = 0
        self._queue: queue.Queue = queue.Queue()
        self._rebuild()
        self._thread = threading.Thread(target=self._writer, name="forge-kv-spill", daemon=True)
        self._thread.start()

    # ---- queries -------------------------------------------------------------------
    def __contains__(self, digest: bytes) -> bool:
        with self._lock:
            return digest in self._pending or digest in self._index

    def find(self, digest: bytes) -> bool:
        """`digest in self`, counted as a lookup (the hit rate's denominator)."""
        self.stats.lookups += 1
        return digest in self

    @property
    def num_files(self) -> int:
        return len(self._index)

    @property
    def num_bytes(self) -> int:
        return self._bytes

    # ---- the step thread -----------------------------------------------------------
    def offer(self, digest: bytes, tokens: tuple[int, ...], block_id: int, wait: bool = False) -> None:
        """An evicted block: copy its K/V now (its slot is about to be reused) and queue the copy for writing.
        When the writer is behind the block is dropped, or (`wait`) the writer is waited for."""
        if wait and self._pending_bytes + self.payload_bytes > MAX_PENDING_BYTES:
            self.flush()
        with self._lock:
            if digest in self._index:
                self._index.move_to_end(digest)
                return
            if digest in self._pending:
                return
            if self._pending_bytes + self.payload_bytes > MAX_PENDING_BYTES:
                self.stats.dropped += 1
                return
            self._pending[digest] = (tokens, self._read_block(block_id))
            self._pending_bytes += self.payload_bytes
        self._queue.put(digest)

    def restore(self, digest: bytes, tokens: tuple[int, ...], block_id: int) -> bool:
        """Read the block `digest` (holding `tokens`) into block `block_id`; False when it is absent or its file
        fails a check (the file is deleted: the caller recomputes)."""
        start = time.perf_counter()
        with self._lock:
            item = self._pending.get(digest)
            on_disk = digest in self._index
        if item is not None and item[0] == tokens:
            data = item[1]
        elif on_disk and (read := self._read(digest, tokens)) is not None:
            data = read
        else:  # absent, or its file failed a check
            return False
        self._write_block(block_id, data)
        self.stats.restored_blocks += 1
        self.stats.restored_bytes += self.payload_bytes
        self.stats.restore_s += time.perf_counter() - start
        return True

    def _read(self, digest: bytes, tokens: tuple[int, ...]) -> np.ndarray | None:
        path = self._path(digest)
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except OSError:  # deleted by the budget meanwhile, or unreadable
            self._drop(digest, path)
            return None
        payload = fmt.decode(raw, self.layout, digest, tokens, self.payload_bytes)
        if payload is None:
            log.warning("KV spill file %s failed its checks: recomputing that block", path.name)
            self.stats.discarded += 1
            self._drop(digest, path)
            return None
        with self._lock:
            if digest in self._index:
                self._index.move_to_end(digest)
        with contextlib.suppress(OSError):
            os.utime(path)  # the order the index is rebuilt in after a restart
        return np.frombuffer(payload, dtype=self.dtype).reshape(self.shape)

    def _drop(self, digest: bytes, path: Path) -> None:
        with self._lock:
            size = self._index.pop(digest, None)
            if size is not None:
                self._bytes -= size
        path.unlink(missing_ok=True)

    # ---- the writer thread ---------------------------------------------------------
    def _writer(self) -> None:
        while True:
            digest = self._queue.get()
            try:
                if digest is None:
                    return
                self._write(digest)
            except Exception:  # a bug here must not stop the writer: flush() would wait forever
                log.exception("KV spill writer failed")
            finally:
                self._queue.task_done()

    def _write(self, digest: bytes) -> None:
        with self._lock:
            tokens, data = self._pending[digest]
        path = self._path(digest)
        size = fmt.file_size(len(tokens), self.payload_bytes)
        written = False
        if size <= self.capacity:
            tmp = path.with_name(f"{digest.hex()}.{os.getpid()}.tmp")  # replicas may share a folder
            try:
                payload = np.ascontiguousarray(data).data.cast("B")
                with open(tmp, "wb") as f:
                    for part in fmt.encode(self.layout, digest, tokens, payload):
                        f.write(part)
                os.replace(tmp, path)
                written = True
            except OSError as exc:  # a full disk or a bad folder costs the spill, never the engine
                tmp.unlink(missing_ok=True)
                self.stats.write_errors += 1
                if self.stats.write_errors % 1000 == 1:
                    log.warning("KV spill write failed (%d so far): %s", self.stats.write_errors, exc)
        with self._lock:
            self._pending.pop(digest, None)
            self._pending_bytes -= self.payload_bytes
            if written:
                self._index[digest] = size
                self._bytes += size
                self.stats.spilled_blocks += 1
                self.stats.spilled_bytes += size
            victims = self._over_budget()
        for victim in victims:
            self._path(victim).unlink(missing_ok=True)

    def _over_budget(self) -> list[bytes]:
        """Take the least recently used files off the index until it fits the budget (under the lock)."""
        victims = []
        while self._bytes > self.capacity and self._index:
            digest, size = self._index.popitem(last=False)
            self._bytes -= size
            victims.append(digest)
        return victims

    # ---- life ----------------------------------------------------------------------
    def _rebuild(self) -> None:
        """The index from the folder: files by modification time; leftovers of an interrupted write removed."""
        found, now = [], time.time()
        for entry in os.scandir(self.dir):
            if entry.name.endswith(".tmp"):
                with contextlib.suppress(OSError):  # another live process's write is younger than this
                    if now - entry.stat().st_mtime > STALE_TMP_S:
                        Path(entry.path).unlink(missing_ok=True)
                continue
            stem, _, suffix = entry.name.partition(".")
            if "." + suffix != fmt.SUFFIX or len(stem) != 32:
                continue
            try:
                digest, st = bytes.fromhex(stem), entry.stat()
            except (ValueError, OSError):
                continue
            found.append((st.st_mtime_ns, digest, st.st_size))
        for _, digest, size in sorted(found):
            self._index[digest] = size
            self._bytes += size
        for victim in self._over_budget():  # the budget may have shrunk since
            self._path(victim).unlink(missing_ok=True)
        if self._index:
            log.info("KV spill: %d blocks (%.1f MB) in %s", len(self._index), self._bytes / 1e6, self.dir)

    def flush(self) -> None:
        """Wait until every handed-over block is written."""
        self._queue.join()

    def close(self, timeout: float | None = None) -> None:
        """Finish the queued writes (for at most `timeout` seconds: an unfinished one leaves only a temp file,
        removed at the next start) and stop the writer."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(timeout)

    def _path(self, digest: bytes) -> Path:
        return self.dir / (digest.hex() + fmt.SUFFIX)

    def snapshot(self) -> dict[str, float]:
        s = self.stats
        return {
            "kv_spill_files": len(self._index),
            "kv_spill_bytes": self._bytes,
            "kv_spill_capacity_bytes": self.capacity,
            "kv_spilled_blocks": s.spilled_blocks,
            "kv_spilled_bytes": s.spilled_bytes,
            "kv_restored_blocks": s.restored_blocks,
            "kv_restored_bytes": s.restored_bytes,
            "kv_spill_lookups": s.lookups,
            "kv_spill_hit_rate": s.restored_blocks / s.lookups if s.lookups else 0.0,
            "kv_spill_restore_seconds": s.restore_s,
            "kv_spill_discarded": s.discarded,
            "kv_spill_dropped": s.dropped,
            "kv_spill_write_errors": s.write_errors,
        }


def spill_tier(loaded: LoadedModel, runner: ModelRunner, directory: str, capacity: int) -> KVSpill:
    """A spill tier for `runner`'s blocks in `directory` (files named for this model, backend and KV layout), at
    most `capacity` bytes. ValueError when no block file fits or the folder is unusable."""
    c, be, m, block_size = loaded.config, runner.backend, loaded, runner.block_size
    kv_dtype = np.dtype(be.kv_dtype)
    shape = (2 * c.num_layers, block_size, c.num_kv_heads, c.head_dim)
    size = fmt.file_size(block_size, int(np.prod(shape)) * kv_dtype.itemsize)
    if capacity < size:
        raise ValueError(
            f"kv_spill_size {capacity} bytes holds no block file ({size} bytes each for this "
            f"model); 0 turns the spill tier off"
        )
    try:
        file_bytes = os.path.getsize(m.path) if os.path.isfile(m.path) else 0
    except OSError:
        file_bytes = 0
    layout = "|".join(
        str(x)
        for x in (
            m.name,
            os.path.basename(m.path),
            file_bytes,
            c.arch,
            m.quant,
            runner.model.weight_bytes,
            be.name,
            getattr(be, "activations", "f32"),
            kv_dtype.str,
            shape,
        )
    )
    try:
        return KVSpill(directory, capacity, layout, shape, kv_dtype, runner.read_block, runner.write_block)
    except OSError as exc:
        raise ValueError(f"kv_spill_dir {directory!r} is not a usable folder: {exc}") from None
