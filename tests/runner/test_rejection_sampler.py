"""Rejection sampling of speculated tokens (``spec_decode/rejection_sampler*.py``).

The torch reference is checked on hand-worked greedy walks and, for random rows, against the
property that makes speculation lossless: the emitted tokens follow the target's distribution
whatever the drafter proposes (Pearson chi-square below its 0.999 quantile, as the sampler's own
test). The Triton kernels must give the reference's tokens on seeded batches (the interpreter on
CPU, real vocabularies with ``-m gpu``).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mrv2_prof.runner.worker.sampler import SamplingMetadata
from mrv2_prof.runner.worker.spec_decode.rejection_sampler import DraftBatch, rejection_sample
from mrv2_prof.runner.worker.spec_decode.rejection_sampler_triton import rejection_sample_triton
from tests.runner.sampler_cases import chi2_quantile, pearson_chi2

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def meta_for(temperature, positions, seeds=None, top_k=None, top_p=None) -> SamplingMetadata:
    n = len(temperature)
    t = lambda x, dt: torch.tensor(x, dtype=dt, device=DEVICE)  # noqa: E731
    return SamplingMetadata(
        idx_mapping=t(list(range(n)), torch.int32),
        positions=t(list(positions), torch.int64),
        temperature=t(list(temperature), torch.float32),
        top_k=t(top_k or [0] * n, torch.int32),
        top_p=t(top_p or [1.0] * n, torch.float32),
        seeds=t(seeds or list(range(100, 100 + n)), torch.int64),
        all_greedy=all(x == 0 for x in temperature),
        no_top_k=top_k is None,
        no_top_p=top_p is None,
    )


def drafts_for(drafts: list[list[int]], max_k: int, probs=None) -> DraftBatch:
    k = [len(d) for d in drafts]
    cu = np.concatenate([[0], np.cumsum([1 + x for x in k])]).tolist()
    ids = torch.zeros((len(drafts), max_k), dtype=torch.int64)
    for b, d in enumerate(drafts):
        ids[b, : len(d)] = torch.tensor(d, dtype=torch.int64)
    return DraftBatch(
        torch.tensor(cu, dtype=torch.int32, device=DEVICE),
        torch.tensor(k, dtype=torch.int32, device=DEVICE),
        ids.to(DEVICE),
        probs,
    )


def one_hot_logits(tokens: list[int], vocab: int) -> torch.Tensor:
    logits = torch.zeros(len(tokens), vocab, device=DEVICE)
    logits[torch.arange(len(tokens)), torch.tensor(tokens)] = 5.0
    return logits


@pytest.mark.parametrize("impl", [rejection_sample, rejection_sample_triton], ids=["ref", "triton"])
def test_greedy_walks_by_hand(impl):
    """Target argmaxes per row; request 0 accepts both drafts and gets the bonus; request 1
    rejects its second draft and gets the correction; request 2 has no drafts; request 3 rejects
    the first."""
    rows = [3, 5, 7] + [3, 4, 6] + [2] + [1, 9]  # argmax of each target row
    drafts = drafts_for([[3, 5], [3, 5], [], [2]], max_k=2)
    out = impl(one_hot_logits(rows, 10), drafts, meta_for([0.0] * 4, [10, 20, 30, 40]))
    assert out.output_token_ids.tolist() == [[3, 5, 7], [3, 4, -1], [2, -1, -1], [1, -1, -1]]
    assert out.num_accepted.tolist() == [2, 1, 0, 0]


@pytest.mark.parametrize("impl", [rejection_sample, rejection_sample_triton], ids=["ref", "triton"])
@pytest.mark.parametrize("mode", ["greedy", "random"])
def test_placeholder_slots_are_never_accepted(impl, mode):
    """Requests padded up to 2 draft slots: a placeholder verifies nothing, even where its id
    (0 here) is its row's argmax. Request 0: one real draft, accepted, then row 1 gives the
    token (0) and the walk stops; request 1: no real draft, row 0 gives the token; request 2:
    two real drafts, both accepted, bonus from row 2; request 3: unpadded, one row."""
    rows = [3, 0, 7] + [0, 0, 9] + [4, 6, 8] + [1]  # argmax of each target row
    drafts = drafts_for([[3], [], [4, 6], []], max_k=2)
    drafts.num_slots = torch.tensor([2, 2, 2, 0], dtype=torch.int32, device=DEVICE)
    drafts.cu_rows = torch.tensor([0, 3, 6, 9, 10], dtype=torch.int32, device=DEVICE)
    temperature = [0.0] * 4 if mode == "greedy" else [0.5] * 4
    logits = one_hot_logits(rows, 10) * (20.0 if mode == "random" else 1.0)  # sharp: p ~ 1
    out = impl(logits, drafts, meta_for(temperature, [10, 20, 30, 40]))
    assert out.output_token_ids.tolist() == [[3, 0, -1], [0, -1, -1], [4, 6, 8], [1, -1, -1]]
    assert out.num_accepted.tolist() == [1, 0, 2, 0]
    unpadded = drafts_for([[3], [], [4, 6], []], max_k=2)  # the same drafts without slots
    keep = [0, 1, 3, 6, 7, 8, 9]  # the rows of the real drafts and the row after them
    want = rejection_sample(logits[keep], unpadded, meta_for(temperature, [10, 20, 30, 40]))
    assert out.output_token_ids.tolist() == want.output_token_ids.tolist()


def test_layout_errors_with_slots():
    logits = one_hot_logits([1, 2, 3], 8)
    ids = torch.zeros(1, 2, dtype=torch.int64, device=DEVICE)
    cu = torch.tensor([0, 3], dtype=torch.int32)
    ok = DraftBatch(cu, torch.tensor([1]), ids, num_slots=torch.tensor([2]))
    assert rejection_sample(logits, ok, meta_for([0.0], [0])).num_accepted.tolist() == [0]
    fewer = DraftBatch(cu, torch.tensor([1]), ids, num_slots=torch.tensor([1]))
    with pytest.raises(ValueError, match="3 rows for 1 drafts in 1 slots"):
        rejection_sample(logits, fewer, meta_for([0.0], [0]))
    more_drafts = DraftBatch(cu, torch.tensor([2]), ids, num_slots=torch.tensor([1]))
    with pytest.raises(ValueError, match="2 drafts in 1 slots"):
        rejection_sample(logits, more_drafts, meta_for([0.0], [0]))


def test_layout_errors():
    logits = one_hot_logits([1, 2, 3], 8)
    ids = torch.zeros(1, 2, dtype=torch.int64, device=DEVICE)
    wrong_rows = DraftBatch(torch.tensor([0, 3], dtype=torch.int32), torch.tensor([1]), ids)
    with pytest.raises(ValueError, match="2 drafts|1 drafts|rows for"):
        rejection_sample(logits, wrong_rows, meta_for([0.0], [0]))
    short = DraftBatch(torch.tensor([0, 2], dtype=torch.int32), torch.tensor([1]), ids)
    with pytest.raises(ValueError, match="does not cover"):
        rejection_sample(logits, short, meta_for([0.0], [0]))


def random_case(seed: int, vocab: int, with_probs: bool, mode: str):
    """A batch of 6 requests with 0..4 drafts; drafts drawn from the draft distribution."""
    gen = torch.Generator().manual_seed(seed)
    k = [0, 1, 2, 3, 4, 2]
    num_rows = sum(1 + x for x in k)
    logits = (2.0 * torch.randn(num_rows, vocab, generator=gen)).to(DEVICE)
    probs = torch.softmax(2.0 * torch.randn(6, 4, vocab, generator=gen), -1)
    drafts = [
        torch.multinomial(probs[b, : k[b]], 1, generator=gen)[:, 0].tolist() for b in range(6)
    ]
    drafts = [d if k[b] else [] for b, d in enumerate(drafts)]
    # make some drafts the target's argmax so greedy rows accept a prefix
    cu = np.concatenate([[0], np.cumsum([1 + x for x in k])])
    for b in (1, 3, 5):
        for j in range(min(2, k[b])):
            drafts[b][j] = int(logits[cu[b] + j].argmax())
    temperature = {
        "greedy": [0.0] * 6,
        "random": [0.7, 1.0, 1.3, 0.9, 1.1, 2.0],
        "mixed": [0.0, 1.0, 0.0, 0.8, 1.2, 0.0],
    }[mode]
    top = (
        dict(top_k=[0, 5, 0, 3, 0, 7], top_p=[1.0, 0.9, 0.5, 1.0, 0.8, 1.0])
        if mode == "mixed"
        else {}
    )
    meta = meta_for(temperature, [7 * b + 3 for b in range(6)], **top)
    return logits, drafts_for(drafts, 4, probs.to(DEVICE) if with_probs else None), meta


@pytest.mark.parametrize("mode", ["greedy", "random", "mixed"])
@pytest.mark.parametrize("with_probs", [False, True], ids=["one-hot", "draft-probs"])
@pytest.mark.parametrize("seed", [0, 1])
def test_triton_equals_the_reference(mode, with_probs, seed):
    logits, drafts, meta = random_case(seed, 300, with_probs, mode)
    want = rejection_sample(logits, drafts, meta)
    got = rejection_sample_triton(logits, drafts, meta)
    assert got.output_token_ids.tolist() == want.output_token_ids.tolist()
    assert got.num_accepted.tolist() == want.num_accepted.tolist()
    emitted = (want.output_token_ids >= 0).sum(1)
    assert torch.equal(emitted.cpu(), want.num_accepted.cpu().long() + 1)


def test_greedy_rows_emit_the_target_argmax_whatever_the_drafts():
    logits, drafts, meta = random_case(3, 300, False, "greedy")
    out = rejection_sample(logits, drafts, meta)
    cu = drafts.cu_rows.tolist()
    for b in range(6):
        a = int(out.num_accepted[b])
        want = logits[cu[b] : cu[b] + a + 1].argmax(-1).tolist()
        assert out.output_token_ids[b, : a + 1].tolist() == want


@pytest.mark.parametrize("with_probs", [False, True], ids=["one-hot", "draft-probs"])
def test_emitted_tokens_follow_the_target_distribution(with_probs):
    """20,000 requests, each with two drafts drawn from a distribution q far from the target's:
    the first emitted token follows p0, and the second (where the first draft was accepted)
    follows p1 — Pearson chi-square over the vocabulary below its 0.999 quantile."""
    n, vocab = 20_000, 8
    gen = torch.Generator().manual_seed(0)
    p_logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -0.5, -1.0, 1.5, 0.2], [0.0, 1.0, 2.0, -1.0] * 2])
    q = torch.softmax(torch.tensor([[-1.0, 0.0, 2.5, 1.0, 0.0, 1.0, -2.0, 0.5]] * 2), -1)
    drafts = torch.multinomial(q.repeat(n, 1), 1, generator=gen).view(n, 2)
    if not with_probs:  # a deterministic drafter: one-hot at whatever it proposes
        q = None
    logits = torch.cat([p_logits, torch.zeros(1, vocab)]).repeat(n, 1)  # rows: p0, p1, bonus
    batch = DraftBatch(
        torch.arange(0, 3 * n + 1, 3, dtype=torch.int32),
        torch.full((n,), 2, dtype=torch.int32),
        drafts,
        None if q is None else q[None].expand(n, 2, vocab),
    )
    meta = meta_for([1.0] * n, [5] * n, seeds=list(range(n)))
    out = rejection_sample(logits, batch, meta)
    p = torch.softmax(p_logits, -1).numpy()
    quantile = chi2_quantile(0.999, vocab - 1)
    first = np.bincount(out.output_token_ids[:, 0].numpy(), minlength=vocab)
    assert pearson_chi2(first, n * p[0]) < quantile
    second_rows = out.num_accepted >= 1
    second = np.bincount(out.output_token_ids[second_rows, 1].numpy(), minlength=vocab)
    assert pearson_chi2(second, second_rows.sum().item() * p[1]) < quantile
    # the acceptance rate of the first draft, worked out from p0 and q0: E_q[min(1, p / q)] for
    # a drafter with probabilities, E_q[p] for one-hot drafts; within 4 standard errors
    q0 = torch.softmax(torch.tensor([-1.0, 0.0, 2.5, 1.0, 0.0, 1.0, -2.0, 0.5]), -1).numpy()
    rate = (np.minimum(q0, p[0]) if with_probs else q0 * p[0]).sum()
    assert abs(second_rows.float().mean().item() - rate) < 4 * (rate * (1 - rate) / n) ** 0.5


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("mode", ["greedy", "random", "mixed"])
@pytest.mark.parametrize("with_probs", [False, True], ids=["one-hot", "draft-probs"])
def test_gpu_triton_equals_the_reference_at_a_real_vocabulary(mode, with_probs):
    logits, drafts, meta = random_case(11, 128_256, with_probs, mode)
    want = rejection_sample(logits, drafts, meta)
    got = rejection_sample_triton(logits, drafts, meta)
    assert got.output_token_ids.tolist() == want.output_token_ids.tolist()


@pytest.mark.parametrize("mode", ["greedy", "random", "mixed"])
@pytest.mark.parametrize("with_probs", [False, True], ids=["one-hot", "draft-probs"])
def test_triton_with_the_runners_host_built_rows_equals_the_reference(mode, with_probs):
    """The runner hands the kernel each row's request and index (built on the host with the
    drafts, as ``Verifier.prepare`` does with numpy) instead of deriving them on the device."""
    import dataclasses

    logits, drafts, meta = random_case(2, 300, with_probs, mode)
    per_req = np.diff(drafts.cu_rows.cpu().numpy())
    row_req = np.repeat(np.arange(len(per_req)), per_req)
    row_j = np.arange(len(row_req)) - drafts.cu_rows.cpu().numpy()[row_req]
    given = dataclasses.replace(
        drafts,
        row_req=torch.from_numpy(row_req).to(DEVICE),
        row_j=torch.from_numpy(row_j).to(DEVICE),
    )
    want = rejection_sample(logits, drafts, meta)
    got = rejection_sample_triton(logits, given, meta)
    assert got.output_token_ids.tolist() == want.output_token_ids.tolist()
    assert got.num_accepted.tolist() == want.num_accepted.tolist()


@pytest.mark.parametrize("num_drafts", [[0, 1, 2], [3], [1, 1, 1, 1, 1], [4, 0, 3, 2, 1, 4, 4]])
def test_every_part_of_the_verify_copy_starts_16_byte_aligned(num_drafts):
    """Triton compiles a kernel per pointer alignment: the verify's parts (views of one device
    buffer) must all start 16-byte aligned whatever the layout, or each new layout compiles."""
    from mrv2_prof.runner.worker.copy_audit import CopyAudit
    from mrv2_prof.runner.worker.spec_decode.verify import Verifier

    verifier = Verifier(8, 4, torch.device("cpu"), CopyAudit(), triton=False)
    req_ids = [f"r{i}" for i in range(len(num_drafts))]
    spec = {r: list(range(3, 3 + n)) for r, n in zip(req_ids, num_drafts, strict=True) if n}
    qsl = np.concatenate([[0], np.cumsum([1 + n for n in num_drafts])]).astype(np.int32)
    inputs = verifier.prepare(req_ids, qsl, spec)
    d = inputs.drafts
    for t in (inputs.draft_index, inputs.draft_tokens, inputs.logits_indices,
              d.draft_token_ids, d.row_req, d.row_j):  # fmt: skip
        assert t.data_ptr() % 16 == 0
    assert d.row_req.tolist() == np.repeat(np.arange(len(num_drafts)), qsl[1:] - qsl[:-1]).tolist()
    assert d.num_draft.tolist() == num_drafts
