"""Prompt logprobs: for each prompt token after the first, its logprob given the tokens before
it, and the top-k alternatives (vLLM's ``prompt_logprobs``).

They come out of prefill steps: every prompt position a step computes (chunked prefill included)
whose next token is also a prompt token. ``plan_prompt_logprobs`` picks those hidden-state rows
on the host; ``compute_prompt_logprobs`` turns them into logits a chunk of rows at a time, so a
long prompt (or a step full of prompts) never materialises more than ``chunk`` x vocab logits, with
one logsumexp per row and logprobs only for the target and the top-k tokens.

Requests asking for prompt logprobs skip the prefix cache (a cached position is never computed)
and their steps do not replay FULL graphs (those keep only the logits of the last tokens).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

CHUNK_ROWS = 256  # rows of [rows, vocab] float32 logits at a time (128 MiB at a 128k vocab)


@dataclass
class PromptLogprobsPlan:
    rows: np.ndarray  # [R] int64: rows of the step's hidden states (token index in the batch)
    targets: np.ndarray  # [R] int64: the prompt token that follows each row's position
    spans: list[tuple[str, int, int, int]]  # (req_id, first position, rows, top-k), row order
    num_top: int  # top-k alternatives per row (the largest any of the requests asked for)


def plan_prompt_logprobs(
    req_ids: list[str],
    query_start_loc: np.ndarray,  # [B+1]
    seq_lens: np.ndarray,  # [B]: context + this step's tokens
    wanted: dict[str, tuple[int, np.ndarray]],  # req_id -> (top-k, prompt token ids)
) -> PromptLogprobsPlan | None:
    """The rows of this step that produce prompt logprobs; None when no request wants any."""
    rows, targets, spans, num_top = [], [], [], 0
    for b, req_id in enumerate(req_ids):
        entry = wanted.get(req_id)
        if entry is None:
            continue
        k, prompt = entry
        count = int(query_start_loc[b + 1] - query_start_loc[b])
        start = int(seq_lens[b]) - count  # position of the step's first token for this request
        end = min(int(seq_lens[b]), len(prompt) - 1)  # positions whose next token is a prompt one
        if end <= start:
            continue
        rows.append(np.arange(end - start, dtype=np.int64) + int(query_start_loc[b]))
        targets.append(np.asarray(prompt[start + 1 : end + 1], dtype=np.int64))
        spans.append((req_id, start, end - start, k))
        num_top = max(num_top, k)
    if not spans:
        return None
    return PromptLogprobsPlan(np.concatenate(rows), np.concatenate(targets), spans, num_top)


def compute_prompt_logprobs(
    compute_logits: Callable[[torch.Tensor], torch.Tensor],  # [N, H] -> float32 [N, V]
    hidden: torch.Tensor,  # [T, H]
    rows: torch.Tensor,  # [R] int64
    targets: torch.Tensor,  # [R] int64
    num_top: int,
    chunk: int | None = None,  # None: CHUNK_ROWS
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids [R, 1 + num_top] (the target first, then the top-k) and their logprobs."""
    chunk = chunk or CHUNK_ROWS
    num_rows = rows.shape[0]
    ids = torch.empty(num_rows, 1 + num_top, dtype=torch.int64, device=hidden.device)
    logprobs = torch.empty(num_rows, 1 + num_top, dtype=torch.float32, device=hidden.device)
    for c in range(0, num_rows, chunk):
        part = slice(c, c + chunk)
        logits = compute_logits(hidden[rows[part]])  # [C, V]
        lse = torch.logsumexp(logits, dim=-1, keepdim=True)
        ids[part, 0] = targets[part]
        if num_top:
            ids[part, 1:] = torch.topk(logits, num_top, dim=-1).indices
        torch.sub(logits.gather(1, ids[part]), lse, out=logprobs[part])
    return ids, logprobs


def compute_planned(
    plan: PromptLogprobsPlan, hidden: torch.Tensor, compute_logits: Callable, copies, device
) -> tuple[torch.Tensor, torch.Tensor]:
    """``compute_prompt_logprobs`` over the rows ``plan`` picked, its host arrays copied to
    ``device`` through ``copies`` (the step's copy audit)."""
    arrays = (plan.rows, plan.targets)
    rows, targets = (copies.to_device(torch.from_numpy(a), device) for a in arrays)
    return compute_prompt_logprobs(compute_logits, hidden, rows, targets, plan.num_top)


def split_by_request(
    plan: PromptLogprobsPlan, ids: list[list[int]], logprobs: list[list[float]]
) -> dict[str, tuple[int, list[list[tuple[int, float]]]]]:
    """Per request: its first position and, per position, (token, logprob) for the target and
    the top-k it asked for (host lists, after the copy)."""
    out = {}
    r = 0
    for req_id, start, n, k in plan.spans:
        per_position = [
            list(zip(ids[i][: 1 + k], logprobs[i][: 1 + k], strict=True)) for i in range(r, r + n)
        ]
        out[req_id] = (start, per_position)
        r += n
    return out
