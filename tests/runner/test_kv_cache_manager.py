"""KVCacheManager and BlockPool: allocation, all-or-nothing failure, freeing, prefix caching."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mrv2_prof.runner.core.block_pool import BlockPool, hash_block_tokens
from mrv2_prof.runner.core.kv_cache_manager import KVCacheManager
from mrv2_prof.runner.core.request import Request, SamplingParams

BLOCK_SIZE = 4


def make_request(request_id: str, token_ids: list[int]) -> Request:
    return Request(request_id, list(token_ids), SamplingParams())


def admit(manager: KVCacheManager, request: Request, num_new_tokens: int | None = None):
    """Schedule a waiting request as the scheduler does: prefix lookup, allocate, compute."""
    computed_blocks, num_computed_tokens = manager.get_computed_blocks(request)
    if num_new_tokens is None:
        num_new_tokens = request.num_tokens - num_computed_tokens
    new_blocks = manager.allocate_slots(
        request, num_new_tokens, computed_blocks, num_computed_tokens
    )
    if new_blocks is not None:
        request.num_computed_tokens += num_computed_tokens + num_new_tokens
    return new_blocks


def snapshot(manager: KVCacheManager):
    pool = manager.block_pool
    return (
        pool.free_block_ids(),
        [(b.ref_cnt, b.block_hash) for b in pool.blocks],
        dict(pool._cached),
        {k: list(v) for k, v in manager.req_to_blocks.items()},
        {k: list(v) for k, v in manager.req_to_block_hashes.items()},
    )


def ref_counts(manager: KVCacheManager, block_ids: list[int]) -> list[int]:
    return [manager.block_pool.blocks[b].ref_cnt for b in block_ids]


def test_allocation_grows_block_list():
    manager = KVCacheManager(num_blocks=10, block_size=BLOCK_SIZE)
    request = make_request("a", range(10))  # 10 tokens -> 3 blocks, 2 of them full

    assert admit(manager, request) == [0, 1, 2]
    assert manager.get_block_ids("a") == [0, 1, 2]
    assert manager.num_free_blocks == 7
    assert manager.usage == pytest.approx(0.3)
    assert len(manager.req_to_block_hashes["a"]) == 2

    # Decode: tokens 11 and 12 fit in block 2; token 13 needs a fourth block.
    for expected in ([], [], [3]):
        request.append_output_token(100 + request.num_tokens)
        assert manager.allocate_slots(request, 1) == expected
        request.num_computed_tokens += 1
        manager.check_consistency()
    assert manager.get_block_ids("a") == [0, 1, 2, 3]
    assert manager.num_free_blocks == 6
    assert len(manager.req_to_block_hashes["a"]) == 3  # block 2 became full at 12 tokens


def test_chunked_prefill_allocates_per_chunk():
    manager = KVCacheManager(num_blocks=10, block_size=BLOCK_SIZE)
    request = make_request("a", range(11))
    assert admit(manager, request, num_new_tokens=5) == [0, 1]
    assert len(manager.req_to_block_hashes["a"]) == 1  # only block 0 is full after 5 tokens
    assert manager.allocate_slots(request, 6) == [2]
    assert len(manager.req_to_block_hashes["a"]) == 2
    manager.check_consistency()


def test_slots_beyond_known_tokens_are_not_cached():
    manager = KVCacheManager(num_blocks=10, block_size=BLOCK_SIZE)
    request = make_request("a", range(6))
    # Three lookahead slots past the known tokens: 9 slots -> 3 blocks, but only block 0 is
    # full of known tokens.
    assert manager.allocate_slots(request, 9) == [0, 1, 2]
    assert len(manager.req_to_block_hashes["a"]) == 1
    assert manager.block_pool.blocks[1].block_hash is None
    manager.check_consistency()


def test_failed_allocation_changes_nothing():
    manager = KVCacheManager(num_blocks=4, block_size=BLOCK_SIZE)
    first = make_request("a", range(9))
    assert admit(manager, first) == [0, 1, 2]
    second = make_request("b", range(50, 58))  # needs 2 blocks, 1 free
    before = snapshot(manager)
    assert manager.allocate_slots(second, 8) is None
    assert snapshot(manager) == before
    # A decode step of the first request that needs a new block still fits.
    assert manager.allocate_slots(first, 4) == [3]
    manager.check_consistency()


def test_failed_allocation_does_not_count_free_computed_blocks():
    manager = KVCacheManager(num_blocks=4, block_size=BLOCK_SIZE)
    first = make_request("a", range(9))
    admit(manager, first)
    manager.free(first)  # blocks 0 and 1 stay cached in the free queue; 4 blocks free
    # 17 tokens -> 5 blocks: 2 from the cache, 3 new, but only 2 of the 4 free blocks are not
    # the cached ones about to be touched.
    second = make_request("b", [*range(8), *range(100, 109)])
    computed, num_computed = manager.get_computed_blocks(second)
    assert (computed, num_computed) == ([0, 1], 8)
    before = snapshot(manager)
    assert manager.allocate_slots(second, 9, computed, num_computed) is None
    assert snapshot(manager) == before
    manager.check_consistency()


def test_free_returns_every_block():
    manager = KVCacheManager(num_blocks=10, block_size=BLOCK_SIZE)
    lengths = [6, 7, 9]  # 2 + 2 + 3 blocks
    requests = [make_request(f"r{i}", range(100 * i, 100 * i + n)) for i, n in enumerate(lengths)]
    for request in requests:
        assert admit(manager, request) is not None
    assert manager.num_free_blocks == 10 - 7
    for request in requests:
        manager.free(request)
        manager.check_consistency()
    assert manager.num_free_blocks == 10
    assert manager.usage == 0.0
    assert all(block.ref_cnt == 0 for block in manager.block_pool.blocks)
    assert manager.req_to_blocks == {} and manager.req_to_block_hashes == {}


def test_same_prefix_hits_full_blocks():
    manager = KVCacheManager(num_blocks=10, block_size=BLOCK_SIZE)
    first = make_request("a", range(10))
    admit(manager, first)
    second = make_request("b", [*range(8), 70, 71, 72])
    assert manager.get_computed_blocks(second) == ([0, 1], 8)
    stats = manager.make_prefix_cache_stats()
    assert (stats.num_requests, stats.num_queried_tokens, stats.num_hit_tokens) == (2, 21, 8)
    assert manager.prefix_cache_stats.num_requests == 0


def test_hit_never_covers_the_last_token():
    manager = KVCacheManager(num_blocks=10, block_size=BLOCK_SIZE)
    first = make_request("a", range(8))  # exactly 2 full blocks
    admit(manager, first)
    assert manager.get_block_ids("a") == [0, 1]
    # Same 8 tokens: both blocks are cached, but the last token must be computed.
    same = make_request("b", range(8))
    assert manager.get_computed_blocks(same) == ([0], 4)
    # One token more: both blocks hit.
    longer = make_request("c", range(9))
    assert manager.get_computed_blocks(longer) == ([0, 1], 8)


def test_hit_stops_at_the_block_that_differs():
    manager = KVCacheManager(num_blocks=10, block_size=BLOCK_SIZE)
    admit(manager, make_request("a", range(12)))
    differs_in_block_1 = make_request("b", [0, 1, 2, 3, 4, 5, 99, 7, 8, 9, 10, 11, 12])
    assert manager.get_computed_blocks(differs_in_block_1) == ([0], 4)
    differs_in_block_0 = make_request("c", [99, 1, 2, 3, 4, 5, 6, 7, 8])
    assert manager.get_computed_blocks(differs_in_block_0) == ([], 0)
    # Block 1's tokens are cached only behind block 0's: the key chains the parent.
    pool = manager.block_pool
    block_1 = [4, 5, 6, 7]
    assert pool.get_cached_block(hash_block_tokens(hash_block_tokens(None, range(4)), block_1)) == 1
    assert (
        pool.get_cached_block(hash_block_tokens(hash_block_tokens(None, [99, 1, 2, 3]), block_1))
        is None
    )
    assert pool.get_cached_block(hash_block_tokens(None, block_1)) is None


def test_shared_blocks_are_ref_counted():
    manager = KVCacheManager(num_blocks=10, block_size=BLOCK_SIZE)
    first = make_request("a", range(10))
    admit(manager, first)
    second = make_request("b", [*range(8), 50, 51, 52, 53, 54])
    assert admit(manager, second) == [3, 4]  # 13 tokens: blocks 0, 1 shared + 2 new
    assert manager.get_block_ids("b") == [0, 1, 3, 4]
    assert second.num_computed_tokens == 13
    assert ref_counts(manager, [0, 1, 2, 3, 4]) == [2, 2, 1, 1, 1]
    manager.check_consistency()

    manager.free(first)
    assert ref_counts(manager, [0, 1, 2]) == [1, 1, 0]
    assert manager.num_free_blocks == 10 - 4
    manager.free(second)
    assert ref_counts(manager, [0, 1, 3, 4]) == [0, 0, 0, 0]
    assert manager.num_free_blocks == 10
    manager.check_consistency()


def test_duplicate_hash_keeps_the_existing_block():
    manager = KVCacheManager(num_blocks=10, block_size=BLOCK_SIZE)
    first, second = make_request("a", range(9)), make_request("b", range(9))
    # Both looked up before either is allocated (same scheduling step): no hits.
    assert manager.get_computed_blocks(first) == ([], 0)
    assert manager.get_computed_blocks(second) == ([], 0)
    assert manager.allocate_slots(first, 9) == [0, 1, 2]
    assert manager.allocate_slots(second, 9) == [3, 4, 5]
    pool = manager.block_pool
    key = hash_block_tokens(None, range(4))
    assert pool.get_cached_block(key) == 0
    assert pool.blocks[3].block_hash is None
    manager.check_consistency()


def test_cached_blocks_survive_free_and_are_evicted_lru():
    manager = KVCacheManager(num_blocks=4, block_size=BLOCK_SIZE)
    first = make_request("a", range(8))
    admit(manager, first)  # blocks 0, 1, both full and cached
    manager.free(first)
    assert manager.block_pool.free_block_ids() == [2, 3, 1, 0]  # tail block evicted before head
    probe = make_request("probe", range(9))
    assert manager.get_computed_blocks(probe) == ([0, 1], 8)

    # Uncached free blocks go first: the cache still hits.
    assert admit(manager, make_request("b", range(100, 108))) == [2, 3]
    assert manager.get_computed_blocks(probe) == ([0, 1], 8)
    # Now the cached tail block is evicted, then the head block.
    assert admit(manager, make_request("c", range(200, 203))) == [1]
    assert manager.get_computed_blocks(probe) == ([0], 4)
    assert admit(manager, make_request("d", range(300, 303))) == [0]
    assert manager.get_computed_blocks(probe) == ([], 0)
    manager.check_consistency()


def test_freed_requests_are_evicted_in_free_order():
    manager = KVCacheManager(num_blocks=4, block_size=BLOCK_SIZE)
    first, second = make_request("a", range(5)), make_request("b", range(50, 55))
    admit(manager, first)  # blocks 0 (cached), 1
    admit(manager, second)  # blocks 2 (cached), 3
    manager.free(first)
    manager.free(second)
    assert admit(manager, make_request("c", range(900, 907))) == [1, 0]
    assert manager.get_computed_blocks(make_request("p", range(5))) == ([], 0)
    assert manager.get_computed_blocks(make_request("q", range(50, 55))) == ([2], 4)


def test_touching_a_cached_free_block_takes_it_off_the_free_queue():
    manager = KVCacheManager(num_blocks=4, block_size=BLOCK_SIZE)
    admit(manager, make_request("a", range(5)))
    manager.free(make_request("a", range(5)))
    second = make_request("b", [*range(4), 9, 9])
    assert admit(manager, second) == [2]  # head of the free queue after 0 is taken back
    assert manager.get_block_ids("b") == [0, 2]
    assert 0 not in manager.block_pool.free_block_ids()
    manager.check_consistency()


def test_caching_disabled():
    manager = KVCacheManager(num_blocks=10, block_size=BLOCK_SIZE, enable_caching=False)
    admit(manager, make_request("a", range(10)))
    assert manager.get_computed_blocks(make_request("b", range(10))) == ([], 0)
    assert all(block.block_hash is None for block in manager.block_pool.blocks)
    manager.check_consistency()


def test_reset_prefix_cache_only_when_idle():
    manager = KVCacheManager(num_blocks=10, block_size=BLOCK_SIZE)
    first = make_request("a", range(9))
    admit(manager, first)
    assert not manager.reset_prefix_cache()
    manager.free(first)
    assert manager.reset_prefix_cache()
    assert manager.get_computed_blocks(make_request("b", range(9))) == ([], 0)
    manager.check_consistency()


def test_pool_rejects_misuse():
    pool = BlockPool(num_blocks=2, enable_caching=True)
    with pytest.raises(ValueError):
        pool.get_new_blocks(3)
    (block_id,) = pool.get_new_blocks(1)
    pool.free_blocks([block_id])
    with pytest.raises(ValueError):
        pool.free_blocks([block_id])
    pool.check_consistency()


def test_consistency_check_catches_corruption():
    manager = KVCacheManager(num_blocks=4, block_size=BLOCK_SIZE)
    admit(manager, make_request("a", range(5)))
    manager.block_pool.blocks[0].ref_cnt += 1
    with pytest.raises(AssertionError):
        manager.check_consistency()
    manager.block_pool.blocks[0].ref_cnt -= 1
    manager.block_pool.blocks[3].ref_cnt = 1  # held but still in the free queue
    with pytest.raises(AssertionError):
        manager.block_pool.check_consistency()


def test_hash_key_compares_tokens_and_chain():
    root = hash_block_tokens(None, [1, 2, 3, 4])
    assert root == hash_block_tokens(None, (1, 2, 3, 4))
    assert hash_block_tokens(root, [5, 6]) == hash_block_tokens(root, [5, 6])
    assert hash_block_tokens(root, [5, 6]) != hash_block_tokens(None, [5, 6])
    assert root.token_ids == (1, 2, 3, 4)


NUM_BLOCKS = 12
PREFIXES = [list(range(0, 14)), list(range(100, 111)), [7] * 13]


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), enable_caching=st.booleans())
def test_random_interleaving_keeps_invariants(seed: int, enable_caching: bool):
    rng = random.Random(seed)
    manager = KVCacheManager(NUM_BLOCKS, BLOCK_SIZE, enable_caching)
    # What each block's slots hold: a prefix hit must find the request's own tokens there.
    kv_contents: dict[int, list[int | None]] = {}
    running: list[Request] = []

    def compute(request: Request, num_new_tokens: int) -> None:
        blocks = manager.get_block_ids(request.request_id)
        for pos in range(request.num_computed_tokens, request.num_computed_tokens + num_new_tokens):
            slots = kv_contents.setdefault(blocks[pos // BLOCK_SIZE], [None] * BLOCK_SIZE)
            slots[pos % BLOCK_SIZE] = request.all_token_ids[pos]
        request.num_computed_tokens += num_new_tokens

    for step in range(60):
        op = rng.random()
        if op < 0.4 or not running:
            prefix = rng.choice(PREFIXES)
            tokens = prefix[: rng.randint(1, len(prefix))] + [
                rng.randrange(3) for _ in range(rng.randint(0, 6))
            ]
            request = make_request(f"r{step}", tokens)
            computed, num_computed = manager.get_computed_blocks(request)
            assert num_computed == len(computed) * BLOCK_SIZE < request.num_tokens
            for i, block_id in enumerate(computed):
                expected = request.all_token_ids[i * BLOCK_SIZE : (i + 1) * BLOCK_SIZE]
                assert kv_contents[block_id] == expected
            num_new = rng.randint(1, request.num_tokens - num_computed)
            before = snapshot(manager)
            new_blocks = manager.allocate_slots(request, num_new, computed, num_computed)
            if new_blocks is None:
                assert snapshot(manager) == before
            else:
                assert manager.get_block_ids(request.request_id) == computed + new_blocks
                request.num_computed_tokens = num_computed
                compute(request, num_new)
                running.append(request)
        elif op < 0.8:
            request = rng.choice(running)
            if request.num_computed_tokens == request.num_tokens:
                request.append_output_token(rng.randrange(3))
            remaining = request.num_tokens - request.num_computed_tokens
            num_new = rng.randint(1, remaining)
            num_held = len(manager.get_block_ids(request.request_id))
            before = snapshot(manager)
            new_blocks = manager.allocate_slots(request, num_new)
            if new_blocks is None:
                assert snapshot(manager) == before
                running.remove(request)
                manager.free(request)  # preempted
            else:
                num_total = request.num_computed_tokens + num_new
                assert num_held + len(new_blocks) == -(-num_total // BLOCK_SIZE)
                compute(request, num_new)
        else:
            request = running.pop(rng.randrange(len(running)))
            manager.free(request)
        manager.check_consistency()

    for request in running:
        manager.free(request)
    manager.check_consistency()
    assert manager.num_free_blocks == NUM_BLOCKS
    assert all(block.ref_cnt == 0 for block in manager.block_pool.blocks)
    assert manager.req_to_blocks == {} and manager.req_to_block_hashes == {}


def test_one_new_block_is_the_head_of_the_free_queue_like_a_list_of_one():
    """``get_new_block`` hands out what ``get_new_blocks(1)`` would: the free queue's head,
    its cached hash evicted, held once; an empty pool refuses."""
    a, b = BlockPool(3, enable_caching=True), BlockPool(3, enable_caching=True)
    h = hash_block_tokens(None, [1, 2])
    for pool in (a, b):
        pool.touch([0])
        pool.cache_block(0, h)
        pool.free_blocks([0])  # block 0 cached and free, at the queue's tail
    assert [a.get_new_block() for _ in range(3)] == b.get_new_blocks(3) == [1, 2, 0]
    for pool in (a, b):
        assert pool.get_cached_block(h) is None and pool.blocks[0].ref_cnt == 1
        pool.check_consistency()
    with pytest.raises(ValueError):
        a.get_new_block()
