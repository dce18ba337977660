"""KV cache blocks: ref counts, an LRU free queue, a prefix-cache map (vLLM's ``BlockPool``).

A freed block keeps its hash while it waits in the free queue, so a later request with the same
prefix can take it back (``touch``); it loses the hash only when ``get_new_blocks`` hands it out
again. The free queue is therefore also the eviction order of cached blocks: head first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple


class BlockHash(NamedTuple):
    """Prefix-cache key of one full block (vLLM's ``BlockHash``).

    ``hash_value`` chains the parent block's hash with this block's tokens; the tokens themselves
    are part of the key, so two blocks match only if their tokens are equal and their prefixes
    hash alike.
    """

    hash_value: int
    token_ids: tuple[int, ...]


def hash_block_tokens(parent: BlockHash | None, token_ids: Sequence[int]) -> BlockHash:
    """The key of a full block whose preceding block has key ``parent`` (None for the first)."""
    tokens = tuple(token_ids)
    parent_value = None if parent is None else parent.hash_value
    return BlockHash(hash((parent_value, tokens)), tokens)


@dataclass(slots=True)
class KVCacheBlock:
    """One block of the paged KV cache (vLLM's ``KVCacheBlock``)."""

    block_id: int
    ref_cnt: int = 0
    block_hash: BlockHash | None = None


class BlockPool:
    """Owns every KV cache block: who holds it (ref counts), which are free, which are cached."""

    def __init__(self, num_blocks: int, enable_caching: bool) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        # Blocks with ref_cnt 0, head evicted first. Values unused: an ordered set.
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cached: dict[BlockHash, int] = {}

    @property
    def num_free_blocks(self) -> int:
        """Blocks nobody holds, cached or not: all of them can be handed out."""
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by at least one request."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def free_block_ids(self) -> list[int]:
        """The free queue, head (next to be evicted) first."""
        return list(self._free)

    def get_new_blocks(self, num_blocks: int) -> list[int]:
        """Take ``num_blocks`` from the free queue head with ref count 1, evicting their hashes."""
        if num_blocks > len(self._free):
            raise ValueError(f"cannot get {num_blocks} blocks, only {len(self._free)} free")
        return [self.get_new_block() for _ in range(num_blocks)]

    def get_new_block(self) -> int:
        """One block from the free queue head with ref count 1, its hash evicted (a decode
        step's one new block, without a list)."""
        if not self._free:
            raise ValueError("cannot get 1 block, only 0 free")
        block_id, _ = self._free.popitem(last=False)
        block = self.blocks[block_id]
        self._evict(block)
        block.ref_cnt = 1
        return block_id

    def touch(self, block_ids: Iterable[int]) -> None:
        """Add a holder to each block; a free (cached) block leaves the free queue."""
        for block_id in block_ids:
            block = self.blocks[block_id]
            if block.ref_cnt == 0:
                del self._free[block_id]
            block.ref_cnt += 1

    def free_blocks(self, block_ids: Iterable[int]) -> None:
        """Drop a holder from each block; those reaching 0 join the free queue tail, in order."""
        for block_id in block_ids:
            block = self.blocks[block_id]
            if block.ref_cnt <= 0:
                raise ValueError(f"block {block_id} freed more often than it was taken")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self._free[block_id] = None

    def get_cached_block(self, block_hash: BlockHash) -> int | None:
        """The block that holds ``block_hash``'s tokens, if any."""
        return self._cached.get(block_hash)

    def cache_block(self, block_id: int, block_hash: BlockHash) -> None:
        """Register a full block under ``block_hash``. An existing mapping for the hash is kept."""
        if not self.enable_caching or block_hash in self._cached:
            return
        block = self.blocks[block_id]
        if block.block_hash is not None:
            raise ValueError(f"block {block_id} is already cached under another hash")
        block.block_hash = block_hash
        self._cached[block_hash] = block_id

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash. Refused (returns False) while any block is held."""
        if self.num_free_blocks != self.num_blocks:
            return False
        for block in self.blocks:
            block.block_hash = None
        self._cached.clear()
        return True

    def _evict(self, block: KVCacheBlock) -> None:
        if block.block_hash is not None:
            del self._cached[block.block_hash]
            block.block_hash = None

    def check_consistency(self) -> None:
        """Raise AssertionError if ref counts, free queue and hash map disagree."""
        num_held = 0
        for block_id, block in enumerate(self.blocks):
            _check(block.block_id == block_id, f"block {block_id} has id {block.block_id}")
            _check(block.ref_cnt >= 0, f"block {block_id} has ref count {block.ref_cnt}")
            in_free = block_id in self._free
            _check(
                in_free == (block.ref_cnt == 0),
                f"block {block_id}: ref count {block.ref_cnt}, in free queue: {in_free}",
            )
            num_held += block.ref_cnt > 0
            if block.block_hash is not None:
                _check(
                    self._cached.get(block.block_hash) == block_id,
                    f"block {block_id} has a hash the map does not point back from",
                )
        _check(
            all(0 <= block_id < self.num_blocks for block_id in self._free),
            "free queue holds an unknown block id",
        )
        _check(len(self._free) + num_held == self.num_blocks, "free + held != num_blocks")
        for block_hash, block_id in self._cached.items():
            _check(
                self.blocks[block_id].block_hash == block_hash,
                f"hash map points at block {block_id}, which has another hash",
            )
        _check(self.enable_caching or not self._cached, "hashes cached with caching disabled")


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(message)
