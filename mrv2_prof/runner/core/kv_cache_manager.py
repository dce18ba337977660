"""Per-request KV cache blocks with prefix caching (vLLM's ``KVCacheManager``).

Paired verbs for the scheduler: ``get_computed_blocks`` (prefix-cache lookup, no side effects on
blocks) → ``allocate_slots`` (all or nothing) → ``free``. Full blocks are registered in the prefix
cache as soon as they are allocated for tokens that this step will compute, as vLLM does.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from mrv2_prof.runner.core.block_pool import BlockHash, BlockPool, hash_block_tokens
from mrv2_prof.runner.core.request import Request


@dataclass
class PrefixCacheStats:
    """Prefix-cache lookups since ``make_prefix_cache_stats`` (vLLM's ``PrefixCacheStats``)."""

    num_requests: int = 0
    num_queried_tokens: int = 0
    num_hit_tokens: int = 0

    @property
    def hit_rate(self) -> float:
        return self.num_hit_tokens / self.num_queried_tokens if self.num_queried_tokens else 0.0


class KVCacheManager:
    """Which blocks each request holds, and the chained hashes of its full blocks."""

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.block_pool = BlockPool(num_blocks, enable_caching)
        self.req_to_blocks: dict[str, list[int]] = {}
        self.req_to_block_hashes: dict[str, list[BlockHash]] = {}
        self.prefix_cache_stats = PrefixCacheStats()

    @property
    def num_free_blocks(self) -> int:
        return self.block_pool.num_free_blocks

    @property
    def usage(self) -> float:
        return self.block_pool.usage

    def get_block_ids(self, request_id: str) -> list[int]:
        return list(self.req_to_blocks.get(request_id, ()))

    def make_prefix_cache_stats(self) -> PrefixCacheStats:
        """The stats gathered since the previous call; starts a new count."""
        stats, self.prefix_cache_stats = self.prefix_cache_stats, PrefixCacheStats()
        return stats

    def get_computed_blocks(self, request: Request) -> tuple[list[int], int]:
        """The cached blocks of the longest prefix of ``request``'s full blocks, and their tokens.

        At most ``num_tokens - 1`` tokens hit, so that the last token is computed for its logits.
        Ref counts are not changed: pass the blocks to ``allocate_slots``.
        """
        if not self.enable_caching:
            return [], 0
        if self.req_to_blocks.get(request.request_id):
            raise ValueError(f"request {request.request_id} already holds blocks")
        block_ids: list[int] = []
        parent = None
        for i in range((request.num_tokens - 1) // self.block_size):
            parent = hash_block_tokens(parent, self._block_tokens(request, i))
            block_id = self.block_pool.get_cached_block(parent)
            if block_id is None:
                break
            block_ids.append(block_id)
        num_computed_tokens = len(block_ids) * self.block_size
        stats = self.prefix_cache_stats
        stats.num_requests += 1
        stats.num_queried_tokens += request.num_tokens
        stats.num_hit_tokens += num_computed_tokens
        return block_ids, num_computed_tokens

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: list[int] | None = None,
        num_new_computed_tokens: int = 0,
    ) -> list[int] | None:
        """Make ``request`` hold blocks for ``num_computed_tokens + num_new_computed_tokens +
        num_new_tokens`` tokens.

        ``new_computed_blocks`` (from ``get_computed_blocks``, first allocation only) become the
        request's first blocks. Returns the newly allocated block ids, to append to the block
        table, or None, changing nothing, when too few blocks are free.
        """
        new_computed_blocks = new_computed_blocks or []
        if num_new_tokens < 0:
            raise ValueError(f"num_new_tokens must be >= 0, got {num_new_tokens}")
        if num_new_computed_tokens > len(new_computed_blocks) * self.block_size:
            raise ValueError(
                f"{num_new_computed_tokens} computed tokens but {len(new_computed_blocks)} blocks"
            )
        req_id = request.request_id
        req_blocks = self.req_to_blocks.get(req_id, [])
        if new_computed_blocks and (req_blocks or request.num_computed_tokens):
            raise ValueError(f"request {req_id}: computed blocks only on its first allocation")

        num_tokens = request.num_computed_tokens + num_new_computed_tokens + num_new_tokens
        num_required_blocks = -(-num_tokens // self.block_size)
        num_held_blocks = len(req_blocks) + len(new_computed_blocks)
        num_new_blocks = max(0, num_required_blocks - num_held_blocks)
        # Cached blocks about to be touched may sit in the free queue; they cannot also be new.
        pool = self.block_pool
        num_free_computed = sum(pool.blocks[b].ref_cnt == 0 for b in new_computed_blocks)
        if num_new_blocks > pool.num_free_blocks - num_free_computed:
            return None

        pool.touch(new_computed_blocks)
        new_blocks = pool.get_new_blocks(num_new_blocks)
        req_blocks = self.req_to_blocks.setdefault(req_id, [])
        req_blocks.extend(new_computed_blocks)
        req_blocks.extend(new_blocks)
        if self.enable_caching:
            num_full_blocks = min(num_tokens, request.num_tokens) // self.block_size
            self._cache_full_blocks(request, req_blocks, num_full_blocks)
        return new_blocks

    def append_slot(self, request: Request) -> list[int]:
        """``allocate_slots(request, 1)`` for a running request whose blocks cover its computed
        tokens (the steady decode step, which counted the free blocks first): a block when
        the next token starts one, and the hash of a block it fills."""
        rid, c, size = request.request_id, request.num_computed_tokens, self.block_size
        blocks = self.req_to_blocks[rid]
        new = []
        if c >= len(blocks) * size:
            new.append(self.block_pool.get_new_block())
            blocks.append(new[0])
        if self.enable_caching:
            num_full = min(c + 1, len(request.all_token_ids)) // size
            self._cache_full_blocks(request, blocks, num_full)
        return new

    def free(self, request: Request) -> None:
        """Release ``request``'s blocks, tail first, so its last blocks are evicted first."""
        blocks = self.req_to_blocks.pop(request.request_id, [])
        self.block_pool.free_blocks(reversed(blocks))
        self.req_to_block_hashes.pop(request.request_id, None)

    def reset_prefix_cache(self) -> bool:
        """Forget all cached blocks; refused (False) while any request holds blocks."""
        return self.block_pool.reset_prefix_cache()

    def _block_tokens(self, request: Request, index: int) -> list[int]:
        start = index * self.block_size
        return request.all_token_ids[start : start + self.block_size]

    def _cache_full_blocks(self, request: Request, blocks: list[int], num_full_blocks: int) -> None:
        hashes = self.req_to_block_hashes.setdefault(request.request_id, [])
        if len(hashes) >= num_full_blocks:
            return
        pool, size, tokens = self.block_pool, self.block_size, request.all_token_ids
        block_hash = hashes[-1] if hashes else None
        for i in range(len(hashes), num_full_blocks):
            block_hash = hash_block_tokens(block_hash, tokens[i * size : (i + 1) * size])
            hashes.append(block_hash)
            if pool.blocks[blocks[i]].block_hash != block_hash:
                pool.cache_block(blocks[i], block_hash)

    def check_consistency(self) -> None:
        """Raise AssertionError if the pool is inconsistent or disagrees with the holdings."""
        pool = self.block_pool
        pool.check_consistency()
        holders = Counter(b for blocks in self.req_to_blocks.values() for b in blocks)
        for block in pool.blocks:
            _check(
                block.ref_cnt == holders[block.block_id],
                f"block {block.block_id}: ref count {block.ref_cnt}, "
                f"held {holders[block.block_id]} times",
            )
        for req_id, blocks in self.req_to_blocks.items():
            _check(len(set(blocks)) == len(blocks), f"request {req_id} holds a block twice")
            hashes = self.req_to_block_hashes.get(req_id, [])
            _check(len(hashes) <= len(blocks), f"request {req_id} has more hashes than blocks")
            for i, block_id in enumerate(blocks):
                block_hash = pool.blocks[block_id].block_hash
                _check(
                    block_hash is None or (i < len(hashes) and hashes[i] == block_hash),
                    f"request {req_id}: block {block_id} is cached under a hash not its own",
                )
        _check(
            self.req_to_block_hashes.keys() <= self.req_to_blocks.keys(),
            "hashes kept for a request that holds no blocks",
        )


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(message)
