"""The KV block manager: sequences share exactly the blocks whose KV they may read.

The state machine keeps a fake KV cache beside the manager: every slot records the whole
prefix its KV was computed from. Whatever sequences come and go, a sequence's computed
positions must hold the KV of its own prefix; a wrong prefix hit, a block evicted while in
use or a write into a shared block would all break that.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from batching_engine.block_manager import BlockManager
from batching_engine.sequence import SamplingParams, Sequence

BS = 8
PREFIXES = [[], [1] * 8, [2] * 12, [1] * 8 + [3] * 8, [1] * 8 + [3] * 8 + [4] * 9]


def seq_of(tokens: list[int]) -> Sequence:
    return Sequence(list(tokens), SamplingParams(max_tokens=10_000))


def slot(seq: Sequence, position: int) -> int:
    return seq.block_table[position // BS] * BS + position % BS


def compute(bm: BlockManager, kv: dict[int, tuple[int, ...]], seq: Sequence, n: int) -> None:
    """What a runner does: write the KV of the next `n` positions, never into a shared block."""
    token_ids = seq.token_ids
    for position in range(seq.num_computed_tokens, seq.num_computed_tokens + n):
        assert bm.ref_count(seq.block_table[position // BS]) == 1, "write into a shared block"
        kv[slot(seq, position)] = tuple(token_ids[: position + 1])
    seq.num_computed_tokens += n
    bm.cache_computed_blocks(seq)


class BlockManagerMachine(RuleBasedStateMachine):
    @initialize(num_blocks=st.integers(4, 24), caching=st.booleans(), touched_first=st.booleans())
    def start(self, num_blocks: int, caching: bool, touched_first: bool) -> None:
        self.bm = BlockManager(num_blocks, BS, caching, touched_first)
        self.kv: dict[int, tuple[int, ...]] = {}
        self.peak_in_use = 0
        self.idle: list[Sequence] = []  # hold no blocks
        self.live: list[Sequence] = []  # hold blocks for all their tokens

    @rule(prefix=st.sampled_from(PREFIXES), suffix=st.lists(st.integers(0, 3), max_size=12))
    def new_sequence(self, prefix: list[int], suffix: list[int]) -> None:
        if prefix or suffix:
            self.idle.append(seq_of(prefix + suffix))

    @precondition(lambda self: self.idle)
    @rule(data=st.data())
    def allocate(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(self.idle))
        needed, free = self.bm.blocks_for(seq.num_tokens), self.bm.num_free_blocks
        if not self.bm.can_allocate(seq):
            assert free < needed
            return
        if not self.bm.enable_prefix_caching:
            assert free >= needed
        in_use = self._in_use()
        self.bm.allocate(seq)
        self.idle.remove(seq)
        self.live.append(seq)
        assert len(seq.block_table) == needed
        assert seq.num_computed_tokens == seq.num_cached_tokens < seq.num_tokens
        assert seq.num_cached_tokens % BS == 0
        hits = seq.num_cached_tokens // BS
        assert in_use.isdisjoint(seq.block_table[hits:]), "took a block someone holds"
        self.peak_in_use = max(self.peak_in_use, len(self._in_use()))

    @precondition(lambda self: any(s.num_uncomputed_tokens for s in self.live))
    @rule(data=st.data(), n=st.integers(1, 20))
    def compute_chunk(self, data: st.DataObject, n: int) -> None:
        seq = data.draw(st.sampled_from([s for s in self.live if s.num_uncomputed_tokens]))
        compute(self.bm, self.kv, seq, min(n, seq.num_uncomputed_tokens))

    @precondition(lambda self: any(not s.num_uncomputed_tokens for s in self.live))
    @rule(data=st.data(), token=st.integers(0, 3))
    def append_token(self, data: st.DataObject, token: int) -> None:
        seq = data.draw(st.sampled_from([s for s in self.live if not s.num_uncomputed_tokens]))
        seq.output_token_ids.append(token)
        if not self.bm.can_append(seq):  # what the scheduler answers with a preemption
            assert self.bm.num_free_blocks == 0
            self._free(seq)
            return
        in_use = self._in_use()
        before = list(seq.block_table)
        self.bm.may_append(seq)
        assert seq.block_table[: len(before)] == before
        assert len(seq.block_table) == self.bm.blocks_for(seq.num_tokens)
        assert in_use.isdisjoint(seq.block_table[len(before) :]), "took a block someone holds"
        self.peak_in_use = max(self.peak_in_use, len(self._in_use()))

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        self._free(data.draw(st.sampled_from(self.live)))

    def _free(self, seq: Sequence) -> None:
        self.bm.deallocate(seq)
        assert seq.block_table == [] and seq.num_computed_tokens == 0
        self.live.remove(seq)
        self.idle.append(seq)

    def _in_use(self) -> set[int]:
        return {b for b in range(self.bm.num_blocks) if self.bm.ref_count(b)}

    @invariant()
    def ref_counts_equal_holders(self) -> None:
        for block in range(self.bm.num_blocks):
            holders = sum(s.block_table.count(block) for s in self.live)
            assert self.bm.ref_count(block) == holders

    @invariant()
    def free_plus_used_is_total(self) -> None:
        used = len(self._in_use())
        assert self.bm.num_free_blocks + used == self.bm.num_blocks
        assert abs(self.bm.usage - used / self.bm.num_blocks) < 1e-9

    @invariant()
    def on_the_cpu_only_the_peak_working_set_was_ever_touched(self) -> None:
        """A never-used block is taken only when every block used before is held."""
        if self.bm.touched_first:
            assert self.bm.num_touched_blocks == self.peak_in_use

    @invariant()
    def no_block_twice_in_a_table(self) -> None:
        for seq in self.live:
            assert len(set(seq.block_table)) == len(seq.block_table)

    @invariant()
    def computed_positions_hold_their_own_prefix(self) -> None:
        for seq in self.live:
            token_ids = seq.token_ids
            for position in range(seq.num_computed_tokens):
                assert self.kv.get(slot(seq, position)) == tuple(token_ids[: position + 1])


TestBlockManagerMachine = BlockManagerMachine.TestCase
TestBlockManagerMachine.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)


def computed(bm: BlockManager, kv: dict[int, tuple[int, ...]], tokens: list[int]) -> Sequence:
    seq = seq_of(tokens)
    bm.allocate(seq)
    compute(bm, kv, seq, seq.num_uncomputed_tokens)
    return seq


def test_a_shared_prefix_is_found_while_held_and_after_release():
    bm, kv = BlockManager(16, BS, True), {}
    first = computed(bm, kv, list(range(20)))
    second = seq_of(list(range(20)) + [99])
    bm.allocate(second)
    assert second.num_cached_tokens == 16 and second.block_table[:2] == first.block_table[:2]
    assert bm.ref_count(first.block_table[0]) == 2
    bm.deallocate(first)
    bm.deallocate(second)
    third = seq_of(list(range(17)))
    bm.allocate(third)
    assert third.num_cached_tokens == 16
    assert bm.num_hit_tokens == 32 and bm.num_queried_tokens == 20 + 21 + 17


def test_the_last_token_is_always_left_to_compute():
    bm, kv = BlockManager(8, BS, True), {}
    computed(bm, kv, list(range(16)))
    again = seq_of(list(range(16)))
    bm.allocate(again)
    # the second block holds the last token: it is computed afresh, not shared
    assert again.num_computed_tokens == 8 and bm.ref_count(again.block_table[1]) == 1


def test_kv_is_findable_only_once_computed():
    bm = BlockManager(8, BS, True)
    prefill = seq_of(list(range(24)))
    bm.allocate(prefill)
    prefill.num_computed_tokens = 8  # first chunk of a chunked prefill
    bm.cache_computed_blocks(prefill)
    reader = seq_of(list(range(25)))
    bm.allocate(reader)
    assert reader.num_cached_tokens == 8


def test_different_earlier_blocks_mean_no_hit():
    bm, kv = BlockManager(8, BS, True), {}
    computed(bm, kv, [1] * 8 + [2] * 8 + [0])
    other = seq_of([5] * 8 + [2] * 8 + [0])
    bm.allocate(other)
    assert other.num_cached_tokens == 0


def test_eviction_takes_the_least_recently_freed_cached_block():
    bm, kv = BlockManager(5, BS, True), {}
    old = computed(bm, kv, [1] * 8 + [0])
    new = computed(bm, kv, [2] * 8 + [0])
    bm.deallocate(old)
    bm.deallocate(new)
    assert bm.num_free_blocks == 5 and bm.usage == 0.0
    # four fresh blocks: the three holding nothing reusable, then old's cached block
    bm.deallocate(computed(bm, kv, [7] * 25))
    hit_new, hit_old = seq_of([2] * 8 + [5]), seq_of([1] * 8 + [5])
    bm.allocate(hit_new)
    bm.allocate(hit_old)
    assert (hit_new.num_cached_tokens, hit_old.num_cached_tokens) == (8, 0)


def test_without_prefix_caching_nothing_is_shared():
    bm, kv = BlockManager(8, BS, False), {}
    computed(bm, kv, list(range(20)))
    again = seq_of(list(range(20)))
    bm.allocate(again)
    assert again.num_cached_tokens == 0 and bm.num_hit_tokens == 0


def test_a_decode_step_takes_a_block_only_when_the_token_starts_one():
    bm = BlockManager(4, BS, False)
    seq = seq_of(list(range(8)))
    bm.allocate(seq)
    seq.output_token_ids.append(1)  # token 9 starts block 2
    assert bm.can_append(seq)
    bm.may_append(seq)
    assert len(seq.block_table) == 2 and bm.num_free_blocks == 2
    seq.output_token_ids.append(2)
    bm.may_append(seq)
    assert len(seq.block_table) == 2


def test_blocks_holding_nothing_reusable_go_before_cached_ones():
    bm, kv = BlockManager(4, BS, True), {}
    bm.deallocate(computed(bm, kv, [1] * 8 + [0]))
    bm.deallocate(computed(bm, kv, [9]))  # freed after the cached block, reused before it
    filler = seq_of([7] * 17)  # three of the four blocks
    bm.allocate(filler)
    bm.deallocate(filler)
    again = seq_of([1] * 8 + [5])
    bm.allocate(again)
    assert again.num_cached_tokens == 8


def test_on_the_cpu_a_cached_block_is_reused_before_a_never_used_one():
    bm, kv = BlockManager(8, BS, True, touched_first=True), {}
    bm.deallocate(computed(bm, kv, [1] * 8 + [0]))  # two blocks used, one of them cached
    bm.deallocate(computed(bm, kv, [2] * 20))  # three: the two again, and one more
    assert bm.num_touched_blocks == 3
    again = seq_of([1] * 8 + [5])
    bm.allocate(again)
    assert again.num_cached_tokens == 0  # its block went to the second sequence


def test_on_a_gpu_never_used_blocks_go_before_cached_ones():
    bm, kv = BlockManager(8, BS, True), {}
    bm.deallocate(computed(bm, kv, [1] * 8 + [0]))
    bm.deallocate(computed(bm, kv, [2] * 20))
    assert bm.num_touched_blocks == 4
    again = seq_of([1] * 8 + [5])
    bm.allocate(again)
    assert again.num_cached_tokens == 8


def test_a_hash_collision_is_caught_by_comparing_tokens(monkeypatch):
    monkeypatch.setattr("batching_engine.block_manager.chain_hash", lambda prev, tokens: 7)
    bm, kv = BlockManager(8, BS, True), {}
    computed(bm, kv, [1] * 8 + [0])
    other = seq_of([2] * 8 + [0])
    bm.allocate(other)
    assert other.num_cached_tokens == 0


def test_an_equal_block_after_a_different_prefix_is_not_a_hit(monkeypatch):
    """Hashes that forget the prefix: the stored predecessor still tells the blocks apart."""
    monkeypatch.setattr(
        "batching_engine.block_manager.chain_hash", lambda prev, tokens: hash(tokens)
    )
    bm, kv = BlockManager(8, BS, True), {}
    computed(bm, kv, [1] * 8 + [3] * 8 + [0])
    computed(bm, kv, [2] * 8 + [0])
    reader = seq_of([2] * 8 + [3] * 8 + [0])
    bm.allocate(reader)
    assert reader.num_cached_tokens == 8
