"""The spill tier without a model: the block file's checks, the writer, the LRU budget, the index rebuilt at start."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

import numpy as np

from engine import kv_spill_file as fmt
from engine.kv_cache import BlockManager
from engine.kv_spill import KVSpill

SHAPE = (4, 2, 1, 8)  # [2 * layers, block_size, kv_heads, head_dim]


class FakeCache:
    """Blocks of K/V as one array; what the model runner's read_block/write_block do."""

    def __init__(self, blocks: int = 8) -> None:
        self.data = np.random.default_rng(0).standard_normal((blocks, *SHAPE)).astype(np.float32)

    def read(self, bid: int) -> np.ndarray:
        return self.data[bid].copy()

    def write(self, bid: int, block: np.ndarray) -> None:
        self.data[bid] = block


def tier(folder, cache: FakeCache, capacity: int = 1 << 20, layout: str = "model|a") -> KVSpill:
    return KVSpill(folder, capacity, layout, SHAPE, np.float32, cache.read, cache.write)


def chain(n: int) -> list[tuple[bytes, tuple[int, ...]]]:
    out, parent = [], None
    for i in range(n):
        tokens = (10 * i, 10 * i + 1)
        parent = fmt.block_digest(parent, tokens)
        out.append((parent, tokens))
    return out


def test_a_file_is_read_only_for_its_own_layout_block_and_bytes():
    layout, other = fmt.layout_digest("a"), fmt.layout_digest("b")
    (digest, tokens), (digest2, _) = chain(2)
    payload = np.arange(16, dtype=np.float32)
    data = b"".join(bytes(p) for p in fmt.encode(layout, digest, tokens, memoryview(payload).cast("B")))
    assert bytes(fmt.decode(data, layout, digest, tokens, 64)) == payload.tobytes()
    assert fmt.decode(data, other, digest, tokens, 64) is None
    assert fmt.decode(data, layout, digest2, tokens, 64) is None
    assert fmt.decode(data, layout, digest, (1, 2), 64) is None
    assert fmt.decode(data[:-1], layout, digest, tokens, 64) is None
    flipped = bytearray(data)
    flipped[-5] ^= 1
    assert fmt.decode(bytes(flipped), layout, digest, tokens, 64) is None


def test_the_chain_digest_depends_on_the_whole_prefix():
    assert fmt.block_digest(None, (1, 2)) == fmt.block_digest(None, (1, 2))
    assert fmt.block_digest(None, (1, 2)) != fmt.block_digest(fmt.block_digest(None, (0,)), (1, 2))


def test_offered_blocks_are_written_and_restored_bit_for_bit(tmp_path):
    cache = FakeCache()
    spill = tier(tmp_path, cache)
    try:
        (d0, t0), (d1, t1) = chain(2)
        want = cache.read(3)
        spill.offer(d0, t0, 3)
        cache.data[3] = 0  # the slot is reused
        assert spill.restore(d0, t0, 5)  # from the writer's copy or the file, whichever is there
        spill.flush()
        assert np.array_equal(cache.data[5], want) and spill.num_files == 1
        cache.data[5] = 0
        assert spill.restore(d0, t0, 5) and np.array_equal(cache.data[5], want)  # from the file
        assert not spill.restore(d1, t1, 5) and not spill.find(d1)
        assert spill.stats.lookups == 1 and spill.stats.restored_blocks == 2
    finally:
        spill.close()


def test_the_budget_keeps_the_most_recently_used_and_a_restart_rebuilds_the_index(tmp_path):
    cache = FakeCache()
    one = fmt.file_size(2, int(np.prod(SHAPE)) * 4)
    spill = tier(tmp_path, cache, capacity=3 * one)
    blocks = chain(5)
    try:
        for i, (digest, tokens) in enumerate(blocks[:3]):
            spill.offer(digest, tokens, i)
        spill.flush()
        time.sleep(0.02)  # file times are coarse: the rebuilt index below orders by them
        assert spill.restore(*blocks[0], 7)  # block 0 is now the most recently used
        for i, (digest, tokens) in enumerate(blocks[3:], 3):
            time.sleep(0.02)
            spill.offer(digest, tokens, i)
            spill.flush()
        kept = {d for d, _ in blocks if d in spill}
        assert kept == {blocks[0][0], blocks[3][0], blocks[4][0]}
        assert len(list(spill.dir.glob("*" + fmt.SUFFIX))) == 3 and spill.num_bytes == 3 * one
    finally:
        spill.close()
    (spill.dir / "leftover.tmp").write_bytes(b"half a write")
    os.utime(spill.dir / "leftover.tmp", (time.time() - 7200, time.time() - 7200))  # an interrupted write's
    (spill.dir / "live.tmp").write_bytes(b"another process writing")
    again = tier(tmp_path, cache, capacity=2 * one)  # a smaller budget at the next start
    try:
        assert again.num_files == 2 and not (again.dir / "leftover.tmp").exists() and (again.dir / "live.tmp").exists()
        assert blocks[0][0] not in again and again.restore(*blocks[4], 6)
        assert np.array_equal(cache.data[6], cache.data[4])
    finally:
        again.close()
    other = tier(tmp_path, cache, layout="model|b")  # another model's layout: its own folder, nothing shared
    try:
        assert other.dir != spill.dir and other.num_files == 0 and not other.restore(*blocks[4], 6)
    finally:
        other.close()


def computed(bm, cache: FakeCache, tokens: list[int]) -> SimpleNamespace:
    """A sequence admitted, its blocks 'computed' (fresh values written) and committed; still holding them."""
    seq = SimpleNamespace(token_ids=tokens, pooled=None, block_table=[], num_computed=0)
    cached = bm.admit(seq)
    assert bm.reserve(seq, len(tokens) - cached)
    for bid in seq.block_table[cached // bm.block_size :]:
        cache.data[bid] = np.random.default_rng(bid + len(tokens)).standard_normal(SHAPE)
    seq.num_computed = len(tokens)
    bm.commit(seq)
    return seq


def test_the_prefix_walk_reads_evicted_blocks_back_and_shares_those_still_in_memory(tmp_path):
    cache = FakeCache(8)
    bm = BlockManager(8, 2)
    bm.spill = tier(tmp_path, cache)
    try:
        a = computed(bm, cache, list(range(11)))  # 5 full blocks + 1 partial
        table = list(a.block_table)
        want = {i: cache.data[bid].copy() for i, bid in enumerate(table[:5])}
        bm.release(a)
        bm.free.move_to_end(table[2], last=False)  # the chain's middle block is the next to go: a gap
        b = computed(bm, cache, [100, 101, 102])  # takes two fresh blocks: evicts the middle one
        assert bm.stats.evictions == 1 and table[2] in b.block_table
        bm.release(b)
        again = SimpleNamespace(token_ids=list(range(13)), pooled=None, block_table=[], num_computed=0)
        # five blocks: two in memory, one read back, two in memory after the gap; then a's partial block
        assert bm.admit(again) == 11
        assert again.block_table[:2] == table[:2] and again.block_table[3:6] == table[3:6]
        assert bm.spill.stats.restored_blocks == 1
        for i, bid in enumerate(again.block_table[:5]):
            assert np.array_equal(cache.data[bid], want[i]), i
    finally:
        bm.spill.close()


def test_the_model_runner_copies_a_block_out_of_and_back_into_a_gpu_kv_cache(monkeypatch):
    """read_block / write_block on the CuPy backend's host code (a NumPy stand-in for CuPy): float16 blocks."""
    import _cupy_stand_in

    from engine.model_runner import ModelRunner
    from kernels.cupy_backend import CupyBackend

    _cupy_stand_in.install(monkeypatch)
    gpu = CupyBackend()
    caches = [(gpu.empty_kv_cache(4, 2, 1, 8), gpu.empty_kv_cache(4, 2, 1, 8)) for _ in range(2)]
    for i, (k, v) in enumerate(caches):
        k[...] = np.arange(k.size, dtype=np.float16).reshape(k.shape) + i
        v[...] = -np.arange(v.size, dtype=np.float16).reshape(v.shape) - i
    runner = SimpleNamespace(backend=gpu, kv_caches=caches)
    block = ModelRunner.read_block(runner, 1)
    assert block.shape == SHAPE and block.dtype == np.float16 and isinstance(block, np.ndarray)
    ModelRunner.write_block(runner, 3, block)
    for k, v in caches:
        assert np.array_equal(np.asarray(k[3]), np.asarray(k[1])) and np.array_equal(np.asarray(v[3]), np.asarray(v[1]))
