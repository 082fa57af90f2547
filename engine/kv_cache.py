"""Paged KV cache bookkeeping: fixed-size blocks, ref counts and hash-chained prefix reuse.

The K/V tensors themselves live in the backend (one array per layer for K and for V,
shaped [num_blocks, block_size, kv_heads, head_dim]); this module only decides which
block each token goes to.

Prefix reuse: a full block is keyed by hash(parent_key, its token ids). A new sequence
walks the keys of its prompt and shares every leading block already cached (ref counted,
never copied). A freed block keeps its key and waits on an LRU free list; it is evicted
only when a fresh block is needed.

Partial blocks are never shared, but a finished sequence's last, partly written block (a
"tail") waits on the free list too, under its parent's key and its tokens: a new sequence
whose prompt goes on past the same full blocks with those tokens takes it over whole and
writes on after them. A chat's next turn thus recomputes only its new tokens, not the
previous reply's last partial block as well (up to `block_size` - 1 tokens a turn).

With a spill tier (engine/kv_spill.py) an evicted block's K/V goes to disk under its chain digest, and a prefix
walk that runs out of cached blocks goes on in the tier, reading blocks back into fresh ones.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.kv_spill_file import block_digest

if TYPE_CHECKING:
    from engine.kv_spill import KVSpill
    from engine.sequence import Sequence


@dataclass(slots=True)
class Block:
    block_id: int
    ref_count: int = 0
    key: int | None = None
    parent_key: int | None = None
    tokens: tuple[int, ...] = ()  # kept for the collision check
    digest: bytes | None = None  # the stable chain digest: the block's name in the spill tier
    tail: bool = False  # a free partial block offered under (parent_key, tokens); never keyed


@dataclass(slots=True)
class PrefixStats:
    queried_tokens: int = 0
    hit_tokens: int = 0
    evictions: int = 0


def block_key(parent_key: int | None, tokens: tuple[int, ...]) -> int:
    return hash((parent_key, tokens))


@dataclass(slots=True)
class BlockManager:
    """Owns every block's state; sequences hold block ids in `seq.block_table`."""

    num_blocks: int
    block_size: int
    blocks: list[Block] = field(init=False)
    free: OrderedDict[int, None] = field(init=False)  # ref_count == 0, least recently used first
    cached: dict[int, int] = field(init=False)  # key -> block id
    tails: dict[int | None, dict[tuple[int, ...], int]] = field(init=False)  # parent key -> tokens -> block id
    stats: PrefixStats = field(default_factory=PrefixStats)
    spill: KVSpill | None = None

    def __post_init__(self) -> None:
        assert self.num_blocks > 0 and self.block_size > 0
        self.blocks = [Block(i) for i in range(self.num_blocks)]
        self.free = OrderedDict((i, None) for i in range(self.num_blocks))
        self.cached = {}
        self.tails = {}

    # ---- queries -------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self.free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free)

    def blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        """Fresh blocks `seq` needs to hold `num_new_tokens` more computed tokens."""
        total = seq.num_computed + num_new_tokens
        return max(0, -(-total // self.block_size) - len(seq.block_table))

    def match_prefix(self, token_ids: list[int]) -> list[int]:
        """Block ids caching the leading full blocks of `token_ids` (no refs taken).

        At least one token is always left uncached so the model produces logits for it.
        """
        bs = self.block_size
        matched: list[int] = []
        parent: int | None = None
        for start in range(0, len(token_ids) - 1 - (len(token_ids) - 1) % bs, bs):
            tokens = tuple(token_ids[start : start + bs])
            key = block_key(parent, tokens)
            bid = self.cached.get(key)
            if bid is None:
                break
            block = self.blocks[bid]
            if block.tokens != tokens or block.parent_key != parent:  # hash collision
                break
            matched.append(bid)
            parent = key
        return matched

    # ---- mutations -----------------------------------------------------------------
    def admit(self, seq: Sequence) -> int:
        """Share the cached prefix of a new (or preempted) sequence; returns tokens reused."""
        assert not seq.block_table and seq.num_computed == 0
        # An embedding pools every token's output: a cached prefix would skip some.
        matched = self.match_prefix(seq.token_ids) if seq.pooled is None else []
        for bid in matched:
            self._take(bid)
        if self.spill is not None and seq.pooled is None:
            matched += self._restore(seq.token_ids, matched)
        seq.block_table = matched
        seq.num_computed = len(matched) * self.block_size
        if seq.pooled is None:
            self._take_tail(seq)
        return seq.num_computed

    def reserve(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Give `seq` blocks for `num_new_tokens` more tokens; False (nothing changed) if full."""
        need = self.blocks_needed(seq, num_new_tokens)
        if need > len(self.free):
            return False
        for _ in range(need):
            seq.block_table.append(self._fresh())
        return True

    def commit(self, seq: Sequence) -> None:
        """Key every newly completed full block of `seq` and offer it to the prefix cache."""
        bs = self.block_size
        full = seq.num_computed // bs
        first = full
        while first > 0 and self.blocks[seq.block_table[first - 1]].key is None:
            first -= 1
        parent = self.blocks[seq.block_table[first - 1]].key if first else None
        digest = self.blocks[seq.block_table[first - 1]].digest if first else None
        for i in range(first, full):
            block = self.blocks[seq.block_table[i]]
            tokens = tuple(seq.token_ids[i * bs : (i + 1) * bs])
            key, digest = block_key(parent, tokens), block_digest(digest, tokens)
            block.key, block.parent_key, block.tokens, block.digest = key, parent, tokens, digest
            # Another sequence may have cached the same content first: keep that one.
            self.cached.setdefault(key, block.block_id)
            parent = key

    def trim(self, seq: Sequence) -> None:
        """Give back the blocks past `seq.num_computed` tokens: they held only rejected draft tokens.

        Such blocks were never committed (only full blocks of accepted tokens are), so no
        un-accepted token ever enters the prefix cache; they are reused first."""
        keep = -(-seq.num_computed // self.block_size)
        while len(seq.block_table) > keep:
            bid = seq.block_table.pop()
            block = self.blocks[bid]
            assert block.ref_count == 1 and block.key is None, f"trimmed block {bid} is shared or cached"
            block.ref_count = 0
            self.free[bid] = None
            self.free.move_to_end(bid, last=False)

    def release(self, seq: Sequence) -> None:
        """Drop `seq`'s references. Cached blocks, and its last partial block, stay reusable until evicted."""
        self._offer_tail(seq)
        # The chain's deep end goes to the free list first so that it is evicted before the
        # shared head (deep blocks are the least likely to be hit again).
        for bid in reversed(seq.block_table):
            block = self.blocks[bid]
            assert block.ref_count > 0, f"double free of block {bid}"
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free[bid] = None
                if block.key is None and not block.tail:  # nothing worth keeping: reuse it first
                    self.free.move_to_end(bid, last=False)
        seq.block_table = []
        seq.num_computed = 0

    def reset_prefix_cache(self, spill: bool = False) -> None:
        """Forget every cached block (`spill`: evict them, to the spill tier when there is one). The free ones are
        reused first, before blocks never written: the KV cache's untouched pages stay unmapped (a 1 GiB budget
        costs only the memory in use)."""
        for bid in list(self.cached.values()):
            block = self.blocks[bid]
            if spill and self.spill is not None and block.digest is not None:
                self.spill.offer(block.digest, block.tokens, bid)
            self._forget(block)
            if self.blocks[bid].ref_count == 0:
                self.free.move_to_end(bid, last=False)
        for tails in list(self.tails.values()):
            for bid in list(tails.values()):
                self._forget(self.blocks[bid])
                self.free.move_to_end(bid, last=False)

    def spill_cached(self, deadline: float | None = None) -> None:
        """Hand the cached blocks to the spill tier, least recently used first, as many as its budget holds, until
        `deadline` (time.monotonic) passes (at shutdown: a restart then warms from disk, conversations' heads too)."""
        if self.spill is None:
            return
        idle = [bid for bid in self.free if self.blocks[bid].digest is not None]
        busy = [bid for bid in self.cached.values() if self.blocks[bid].ref_count and self.blocks[bid].digest]
        order = idle + busy
        fits = self.spill.capacity // max(1, self.spill.payload_bytes)
        for bid in order[-fits:] if fits else []:
            if deadline is not None and time.monotonic() > deadline:
                break
            block = self.blocks[bid]
            assert block.digest is not None  # idle and busy above hold only blocks with a digest
            self.spill.offer(block.digest, block.tokens, bid, wait=True)

    # ---- internals -----------------------------------------------------------------
    def _take(self, bid: int) -> None:
        block = self.blocks[bid]
        if block.ref_count == 0:
            del self.free[bid]
        block.ref_count += 1

    def _fresh(self) -> int:
        bid, _ = self.free.popitem(last=False)
        block = self.blocks[bid]
        assert block.ref_count == 0
        if block.key is not None:
            self.stats.evictions += 1
            if self.spill is not None and block.digest is not None:
                self.spill.offer(block.digest, block.tokens, bid)
        self._forget(block)
        block.ref_count = 1
        return bid

    def _offer_tail(self, seq: Sequence) -> None:
        """Offer the partly written block after `seq`'s full ones, before `seq` lets go of it."""
        bs = self.block_size
        full, written = divmod(seq.num_computed, bs)
        if not written or seq.pooled is not None or full >= len(seq.block_table):
            return
        block = self.blocks[seq.block_table[full]]
        parent = self.blocks[seq.block_table[full - 1]].key if full else None
        if block.ref_count != 1 or block.key is not None or block.tail or (full and parent is None):
            return  # shared, or after a block that is not in the prefix cache
        tokens = tuple(seq.token_ids[full * bs : seq.num_computed])
        offered = self.tails.setdefault(parent, {})
        if tokens not in offered:  # one copy of the same tail is enough
            offered[tokens] = block.block_id
            block.tail, block.parent_key, block.tokens = True, parent, tokens

    def _take_tail(self, seq: Sequence) -> None:
        """Take over the longest free tail that goes on from `seq`'s cached full blocks (leaving one token
        to compute), as its next block."""
        bs, table = self.block_size, seq.block_table
        parent = self.blocks[table[-1]].key if table else None
        offered = self.tails.get(parent)
        if not offered or (table and parent is None):
            return
        start = len(table) * bs
        room = len(seq.token_ids) - 1 - start
        best: tuple[int, ...] = ()
        for tokens in offered:
            if len(best) < len(tokens) <= room and tuple(seq.token_ids[start : start + len(tokens)]) == tokens:
                best = tokens
        if not best:
            return
        bid = offered[best]
        block = self.blocks[bid]
        assert block.ref_count == 0 and block.tail, f"offered tail {bid} is in use"
        self._forget(block)
        del self.free[bid]
        block.ref_count = 1
        table.append(bid)
        seq.num_computed = start + len(best)

    def _restore(self, token_ids: list[int], matched: list[int]) -> list[int]:
        """Go on with the prefix walk past the cached blocks `matched` (taken) in the spill tier: each block found
        there is read into a fresh block (taken, cached); one back in memory after a gap is shared. Stops at the
        first block found nowhere, or refused."""
        assert self.spill is not None
        bs = self.block_size
        last = self.blocks[matched[-1]] if matched else None
        parent, digest = (last.key, last.digest) if last else (None, None)
        restored: list[int] = []
        for start in range(len(matched) * bs, len(token_ids) - 1 - (len(token_ids) - 1) % bs, bs):
            tokens = tuple(token_ids[start : start + bs])
            key, digest = block_key(parent, tokens), block_digest(digest, tokens)
            bid = self.cached.get(key)
            if bid is not None and self.blocks[bid].digest == digest:  # in memory after a gap: shared as usual
                self._take(bid)
            else:
                if not self.free or not self.spill.find(digest):
                    break
                bid = self._fresh()
                block = self.blocks[bid]
                if not self.spill.restore(digest, tokens, bid):
                    block.ref_count = 0
                    self.free[bid] = None
                    self.free.move_to_end(bid, last=False)
                    break
                block.key, block.parent_key, block.tokens, block.digest = key, parent, tokens, digest
                self.cached.setdefault(key, bid)
            restored.append(bid)
            parent = key
        return restored

    def _forget(self, block: Block) -> None:
        if block.key is not None and self.cached.get(block.key) == block.block_id:
            del self.cached[block.key]
        if block.tail:
            offered = self.tails[block.parent_key]
            del offered[block.tokens]
            if not offered:
                del self.tails[block.parent_key]
        block.key, block.parent_key, block.tokens, block.digest, block.tail = None, None, (), None, False
