"""The draft model's work inside a step (vLLM's draft-model proposer, MRV2's speculator).

After the target's forward and sample of a step (decode, prefill or verify) the proposer, on the
device and without reading anything back:

1. **catch-up**: runs the draft model over the step's tokens (the same ``input_ids`` and
   positions as the target, drafts included), writing their KV into its own cache;
2. **k draft steps** from each request's last emitted token at its new length (the step's
   sequence length less the rejected drafts): one token a request a step, greedy (argmax) for a
   greedy request, else drawn from ``q = softmax(logits / T)`` with the request's seed salted
   (``DRAFT_SEED_SALT``: the verify's noise at the same position stays independent of the
   draft's) and ``q`` kept per request slot for the rejection sampler's lossless rule. Top-k /
   top-p are not applied to ``q``: any ``q`` the drafts are drawn from keeps the rule lossless.

The draft's KV cache is its own and dense: ``max_num_reqs + 1`` rows of ``max_model_len``
tokens, request slot r's block i being ``r * blocks_per_req + i`` (the last row is scratch for a
graph's padding rows). It is the simplest layout that is always correct: the draft steps write
up to k positions past a request's scheduled tokens, where the target's blocks need not exist
yet, and a slot's rows are the request's for its whole life, so nothing is shared with the
scheduler's block accounting. It costs ``max_num_reqs x max_model_len`` tokens of the draft's
layers (``kv_cache_bytes``). A prefix-cache hit's cached tokens were never computed by the draft:
``prefill_cached`` runs the draft over them when the request arrives.

The k steps go through ``DraftGraphs`` (``draft_graph.py``: one FULL graph per batch size, k and
greedy / sampled) on CUDA when captured, else ``draft_steps`` eagerly. Requests that are not at
their last token (a prefill chunk) draft too, from a token the host discards; what they write
lies past their tokens and is rewritten by their next chunk's catch-up.
"""

from __future__ import annotations

import numpy as np
import torch

from mrv2_prof.runner.model.args import kv_cache_shape
from mrv2_prof.runner.model.attention import AttentionMetadata
from mrv2_prof.runner.worker.input_batch import InputBatch
from mrv2_prof.runner.worker.sampler import GREEDY_TEMPERATURE, gumbel_noise

DRAFT_SEED_SALT = 0x2545F4914F6CDD1D  # xor-ed into a request's seed for its draft samples


class DraftState:
    """The draft model's cache and per-slot draft probabilities, and its geometry."""

    def __init__(
        self, model, max_k: int, max_num_reqs: int, max_model_len: int, block_size: int,
        device: torch.device, host_lengths: bool,
    ) -> None:  # fmt: skip
        args = model.args
        self.model, self.max_k, self.block_size = model, max_k, block_size
        self.max_model_len = max_model_len
        self.blocks_per_req = -(-max_model_len // block_size)
        self.row_len = self.blocks_per_req * block_size  # cache slots per request row
        self.scratch_row = max_num_reqs  # padding rows of a graph replay use it
        rows = max_num_reqs + 1
        dtype = model.lm_head_weight.dtype
        shape = kv_cache_shape(args, rows * self.blocks_per_req, block_size)
        self.kv_caches = [
            torch.zeros(shape, dtype=dtype, device=device) for _ in range(args.num_hidden_layers)
        ]
        self.block_ids = torch.arange(
            rows * self.blocks_per_req, dtype=torch.int32, device=device
        ).view(rows, self.blocks_per_req)
        self.probs = torch.zeros((rows, max_k, args.vocab_size), dtype=torch.float32, device=device)
        self.host_lengths = host_lengths  # the torch attention reads the lengths on the host
        self.kv_cache_bytes = sum(t.numel() * t.element_size() for t in self.kv_caches)
        self.probs_bytes = self.probs.numel() * self.probs.element_size()
        self._qsl: dict[int, torch.Tensor] = {}  # catch_up_uniform's query_start_loc per q

    def meta(
        self,
        query_start_loc: torch.Tensor,
        seq_lens: torch.Tensor,
        block_table: torch.Tensor,
        slot_mapping: torch.Tensor,
        query_start_loc_np: np.ndarray,
        seq_lens_np: np.ndarray | None,
    ) -> AttentionMetadata:
        num_reqs = block_table.shape[0]
        if seq_lens_np is None:  # the Triton attention never reads it
            seq_lens_np = seq_lens.cpu().numpy() if self.host_lengths else np.ones(num_reqs)
        return AttentionMetadata(
            num_reqs=num_reqs,
            num_tokens=slot_mapping.shape[0],
            query_start_loc=query_start_loc,
            seq_lens=seq_lens,
            block_table=block_table,
            slot_mapping=slot_mapping,
            query_start_loc_np=query_start_loc_np,
            seq_lens_np=seq_lens_np,
            block_size=self.block_size,
        )

    def catch_up(self, batch: InputBatch) -> None:
        """The draft model over the step's tokens: their KV into the draft's cache."""
        slots = batch.idx_mapping.long()
        token_slot = torch.repeat_interleave(
            slots, batch.num_scheduled_tokens.long(), output_size=batch.num_tokens
        )
        slot_mapping = token_slot * self.row_len + batch.positions
        meta = self.meta(
            batch.query_start_loc,
            batch.seq_lens,
            self.block_ids[slots],
            slot_mapping,
            batch.query_start_loc_np,
            batch.seq_lens_np,
        )
        self.model(batch.input_ids, batch.positions, self.kv_caches, meta)

    def catch_up_uniform(
        self, input_ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, q: int
    ) -> None:
        """``catch_up`` for a batch whose every request computed ``q`` tokens (``input_ids`` and
        ``positions`` [B * q], request-major; ``slots`` [B] int64): shapes fixed by B and q, no
        host array, so it can be captured in the draft graph."""
        num_reqs = slots.shape[0]
        token_slot = slots[:, None].expand(num_reqs, q).reshape(-1)
        seq_lens = (positions.view(num_reqs, q)[:, -1] + 1).to(torch.int32)
        qsl_np = np.arange(0, q * (num_reqs + 1), q, dtype=np.int32)
        qsl = self.query_start_loc(q, num_reqs)
        meta = self.meta(
            qsl, seq_lens, self.block_ids[slots], token_slot * self.row_len + positions, qsl_np,
            None,
        )  # fmt: skip
        self.model(input_ids, positions, self.kv_caches, meta)

    def query_start_loc(self, q: int, num_reqs: int) -> torch.Tensor:
        """0, q, 2q, ..., B q on the device (made once per q, then a view)."""
        t = self._qsl.get(q)
        if t is None or t.shape[0] < num_reqs + 1:
            n = self.block_ids.shape[0] + 1
            t = self._qsl[q] = torch.arange(
                0, q * n, q, dtype=torch.int32, device=self.block_ids.device
            )
        return t[: num_reqs + 1]

    def prefill_cached(self, slot: int, token_ids: torch.Tensor) -> None:
        """A new request's prefix-cache hit: the draft over its ``C`` cached tokens [C] (on the
        device), positions 0..C-1 of its row."""
        c = token_ids.shape[0]
        device = token_ids.device
        positions = torch.arange(c, dtype=torch.int64, device=device)
        qsl = torch.full((2,), c, dtype=torch.int32, device=device)  # fills: no host copy
        qsl[0] = 0
        meta = self.meta(
            qsl,
            qsl[1:],
            self.block_ids[slot : slot + 1],
            slot * self.row_len + positions,
            np.array([0, c], dtype=np.int32),
            np.array([c], dtype=np.int32),
        )
        self.model(token_ids, positions, self.kv_caches, meta)


def draft_steps(
    state: DraftState,
    last_tokens: torch.Tensor,  # [B] int64: each request's last emitted token
    start: torch.Tensor,  # [B] int64: its position (the request's new length)
    slots: torch.Tensor,  # [B] int64: request slot (cache row, probs row)
    temperature: torch.Tensor,  # [B] float32
    seeds: torch.Tensor,  # [B] int64
    query_start_loc: torch.Tensor,  # [B + 1] int32: 0, 1, ..., B
    k: int,
    sampled: bool,  # some request samples: draw from q and keep it (else argmax only)
    out: torch.Tensor,  # [B, >= k] int64: the drafts, written
) -> None:
    """``k`` autoregressive draft steps, all on the device (eager, or inside a CUDA graph)."""
    num_reqs = last_tokens.shape[0]
    qsl_np = np.arange(num_reqs + 1, dtype=np.int32)
    block_table = state.block_ids[slots]
    base = slots * state.row_len
    greedy = temperature < GREEDY_TEMPERATURE
    divisor = torch.where(greedy, 1.0, temperature)[:, None]
    salted = seeds ^ DRAFT_SEED_SALT
    x, pos = last_tokens, start
    for j in range(k):
        pos = pos.clamp(max=state.max_model_len - 1)  # past the end: garbage the host drops
        meta = state.meta(
            query_start_loc, (pos + 1).to(torch.int32), block_table, base + pos, qsl_np, None
        )
        hidden = state.model(x, pos, state.kv_caches, meta)  # [B, H]
        logits = state.model.logits(hidden).float()  # [B, V]
        token = logits.argmax(dim=-1)
        if sampled:
            scaled = logits / divisor
            noise = gumbel_noise(salted, pos + 1, logits.shape[1])
            token = torch.where(greedy, token, (scaled + noise).argmax(dim=-1))
            state.probs[slots, j] = scaled.softmax(dim=-1)
        out[:, j] = token
        x, pos = token, pos + 1
