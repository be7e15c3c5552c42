"""The paged KV cache's bookkeeping: which physical blocks each sequence holds.

Methods come in check/commit pairs (`can_allocate`/`allocate`, `can_append`/`may_append`) so
the scheduler changes nothing until it knows a change will succeed. Blocks are reference
counted: a prefix shared by several sequences is freed only when its last user leaves.

Prefix caching keys each FULL block by a hash chained over every block before it, so equal
hashes mean equal prefixes; a hit is still confirmed against the stored tokens. A block is
registered only once its KV is computed (`cache_computed_blocks`), never at admission, so a
sequence can never read KV that a chunked prefill has yet to write. Freed blocks keep their
hash and stay reusable until a fresh block is needed, then the least recently freed goes.

Which block a fresh one is depends on what an unused block costs. On a GPU the whole cache is
committed at start, so blocks never used before are taken first and cached prefixes live as
long as possible. On the CPU (`touched_first`) the cache's pages are committed only as blocks
are first written (`model/kv_cache.py`), so a block used before is taken first, even a cached
one, and a never-used block only when none is free: the engine's resident cache then follows
its peak working set, not the whole budget, at the price of cached prefixes that do not
outlive it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from batching_engine.sequence import Sequence

_ROOT_HASH = 0


@dataclass(slots=True)
class _Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None  # set while the block is findable in the prefix cache
    prev_hash: int = _ROOT_HASH
    token_ids: tuple[int, ...] = ()


def chain_hash(prev_hash: int, token_ids: tuple[int, ...]) -> int:
    """The key of a full block: its tokens and, through `prev_hash`, every token before them."""
    return hash((prev_hash, token_ids))


class BlockManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool,
        touched_first: bool = False,
    ) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks: the KV cache needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.touched_first = touched_first  # see the module's note
        self._blocks = [_Block(i) for i in range(num_blocks)]
        # ref-count-0 blocks used before, the next to be reused first: uncached, then LRU cached
        self._free: OrderedDict[int, None] = OrderedDict()
        self._untouched = list(range(num_blocks - 1, -1, -1))  # never used; popped lowest first
        self._cached: dict[int, int] = {}  # chain hash -> block id
        self._chains: dict[int, list[int]] = {}  # seq id -> chain hashes of its computed blocks
        self.num_queried_tokens = 0  # prompt tokens looked up in the prefix cache, ever
        self.num_hit_tokens = 0  # of those, tokens found

    @property
    def num_free_blocks(self) -> int:
        return len(self._free) + len(self._untouched)

    @property
    def num_touched_blocks(self) -> int:
        """Blocks ever used: on the CPU, the cache's resident share."""
        return self.num_blocks - len(self._untouched)

    @property
    def usage(self) -> float:
        """Share of blocks held by sequences; cached blocks nobody holds count as free."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def ref_count(self, block_id: int) -> int:
        return self._blocks[block_id].ref_count

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def can_allocate(self, seq: Sequence) -> bool:
        hits = self._lookup(seq)
        fresh = self.blocks_for(seq.num_tokens) - len(hits)
        idle_hits = sum(1 for b in hits if self._blocks[b].ref_count == 0)
        return fresh + idle_hits <= self.num_free_blocks

    def allocate(self, seq: Sequence) -> None:
        """Blocks for every current token; the cached prefix counts as computed."""
        assert not seq.block_table, f"sequence {seq.seq_id} already holds blocks"
        hits = self._lookup(seq)
        for block_id in hits:
            self._take(block_id)
        fresh = [self._take_fresh() for _ in range(self.blocks_for(seq.num_tokens) - len(hits))]
        seq.block_table = hits + fresh
        seq.num_cached_tokens = seq.num_computed_tokens = len(hits) * self.block_size
        self._chains[seq.seq_id] = [self._blocks[b].hash for b in hits]  # type: ignore[misc]
        if self.enable_prefix_caching:
            self.num_queried_tokens += seq.num_tokens
            self.num_hit_tokens += seq.num_cached_tokens

    def can_append(self, seq: Sequence) -> bool:
        return self._missing_blocks(seq) <= self.num_free_blocks

    def may_append(self, seq: Sequence) -> None:
        """A fresh block when the newest token starts one; nothing otherwise."""
        for _ in range(self._missing_blocks(seq)):
            seq.block_table.append(self._take_fresh())

    def cache_computed_blocks(self, seq: Sequence) -> None:
        """Make every full block whose KV is now computed findable by later sequences."""
        if not self.enable_prefix_caching:
            return
        chain = self._chains[seq.seq_id]
        full = seq.num_computed_tokens // self.block_size
        if len(chain) >= full:
            return
        token_ids = seq.token_ids
        for index in range(len(chain), full):
            prev = chain[-1] if chain else _ROOT_HASH
            tokens = tuple(token_ids[index * self.block_size : (index + 1) * self.block_size])
            chain.append(self._register(seq.block_table[index], prev, tokens))

    def deallocate(self, seq: Sequence) -> None:
        """Release the sequence's blocks, tail first, so its prefix is the last evicted."""
        for block_id in reversed(seq.block_table):
            self._release(block_id)
        seq.block_table = []
        seq.num_computed_tokens = 0
        self._chains.pop(seq.seq_id, None)

    def _missing_blocks(self, seq: Sequence) -> int:
        return max(0, self.blocks_for(seq.num_tokens) - len(seq.block_table))

    def _lookup(self, seq: Sequence) -> list[int]:
        """Cached blocks equal to the sequence's leading full blocks, stopping at the first miss.

        Only blocks before the one holding the last token are eligible: the runner must
        compute at least that token to sample from it, and it never writes a shared block.
        """
        if not self.enable_prefix_caching:
            return []
        token_ids, hits, prev = seq.token_ids, [], _ROOT_HASH
        for index in range((seq.num_tokens - 1) // self.block_size):
            tokens = tuple(token_ids[index * self.block_size : (index + 1) * self.block_size])
            block_id = self._cached.get(chain_hash(prev, tokens))
            if block_id is None or not self._holds(block_id, prev, tokens):
                break
            hits.append(block_id)
            prev = self._blocks[block_id].hash  # type: ignore[assignment]
        return hits

    def _holds(self, block_id: int, prev_hash: int, tokens: tuple[int, ...]) -> bool:
        block = self._blocks[block_id]
        return block.prev_hash == prev_hash and block.token_ids == tokens

    def _register(self, block_id: int, prev_hash: int, tokens: tuple[int, ...]) -> int:
        """The block's chain hash; it becomes findable unless an equal block already is."""
        key = chain_hash(prev_hash, tokens)
        block = self._blocks[block_id]
        assert block.ref_count > 0, f"block {block_id} is registered while free"
        if key not in self._cached and block.hash is None:
            block.hash, block.prev_hash, block.token_ids = key, prev_hash, tokens
            self._cached[key] = block_id
        return key

    def _take(self, block_id: int) -> None:
        block = self._blocks[block_id]
        if block.ref_count == 0:
            del self._free[block_id]
        block.ref_count += 1

    def _take_fresh(self) -> int:
        """The next free block (see the module's note), evicting its cached prefix if it had
        one."""
        block_id = self._next_fresh()
        block = self._blocks[block_id]
        assert block.ref_count == 0, f"free block {block_id} has ref count {block.ref_count}"
        if block.hash is not None:
            assert self._cached.pop(block.hash) == block_id, f"block {block_id} cache key stale"
            block.hash, block.prev_hash, block.token_ids = None, _ROOT_HASH, ()
        block.ref_count = 1
        return block_id

    def _next_fresh(self) -> int:
        """Freed blocks holding nothing reusable first; then, on a GPU, never-used blocks
        before cached ones, and on the CPU after them."""
        if self._free:
            first = next(iter(self._free))
            if self.touched_first or self._blocks[first].hash is None or not self._untouched:
                del self._free[first]
                return first
        return self._untouched.pop()

    def _release(self, block_id: int) -> None:
        block = self._blocks[block_id]
        assert block.ref_count > 0, f"block {block_id} released while free"
        block.ref_count -= 1
        if block.ref_count == 0:
            self._free[block_id] = None
            if block.hash is None:  # holds nothing reusable: reuse it before any cached block
                self._free.move_to_end(block_id, last=False)
