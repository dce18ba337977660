"""Start-up on the CPU: the dummy batch, and dummy runs that leave no trace in the request
slots or in the probe."""

from __future__ import annotations

import numpy as np
import torch

from mrv2_prof.probes.recording import RecordingProbe
from mrv2_prof.runner.config import ModelSpec, RunnerConfig
from mrv2_prof.runner.worker.block_table import BlockTables
from mrv2_prof.runner.worker.input_batch import dummy_batch
from mrv2_prof.runner.worker.model_runner import ModelRunner
from mrv2_prof.runner.worker.startup import dummy_run, initialize_kv_cache, profile_run, start_up

CPU = torch.device("cpu")


def test_dummy_batch_spreads_the_tokens_over_fresh_prefills_that_write_no_kv_slot():
    tables = BlockTables(2, 5, CPU, staged=True)
    batch = dummy_batch(10, 3, 2, CPU, tables)
    assert batch.req_ids == ["dummy-0", "dummy-1", "dummy-2"]
    assert (batch.num_reqs, batch.num_tokens) == (3, 10)
    assert batch.num_scheduled_tokens_np.tolist() == [4, 3, 3]
    assert batch.idx_mapping_np.tolist() == [0, 1, 0]  # slots wrap at max_num_reqs
    assert batch.idx_mapping.tolist() == [0, 1, 0]
    assert batch.query_start_loc_np.tolist() == batch.query_start_loc.tolist() == [0, 4, 7, 10]
    assert batch.positions.tolist() == [0, 1, 2, 3, 0, 1, 2, 0, 1, 2]  # fresh prefills
    assert batch.seq_lens_np.tolist() == batch.seq_lens.tolist() == [4, 3, 3]
    assert batch.logits_indices.tolist() == [3, 6, 9]
    assert batch.slot_mapping.tolist() == [-1] * 10
    assert batch.input_ids.shape == (10,) and batch.block_table.shape == (3, 5)


def state_of(runner: ModelRunner) -> dict[str, np.ndarray]:
    rs = runner.req_states
    tensors = {
        "prefill_token_ids": rs.prefill_token_ids.gpu,
        "num_prefill_tokens": rs.num_prefill_tokens.gpu,
        "num_computed_tokens": rs.num_computed_tokens.gpu,
        "last_sampled_tokens": rs.last_sampled_tokens,
        "block_table": runner.block_tables.table.gpu,
    }
    return {name: t.clone().numpy() for name, t in tensors.items()}


def test_dummy_runs_change_no_request_state_and_report_nothing():
    probe = RecordingProbe()
    config = RunnerConfig(device="cpu", num_kv_blocks=16, max_model_len=64, max_num_seqs=4)
    runner = ModelRunner(config, ModelSpec(), probe)
    before = state_of(runner)
    profile_run(runner)
    initialize_kv_cache(runner)
    dummy_run(runner, 7, 3)
    after = state_of(runner)
    assert before.keys() == after.keys()
    for name in before:
        assert np.array_equal(before[name], after[name]), name
    assert not runner.req_states.slot_of
    assert runner.graph_mode_of_last_step == "none"
    recorded = {name: len(next(iter(t.values()))) for name, t in probe.drain().items() if t}
    assert not any(recorded.values()), recorded


def test_start_up_allocates_the_kv_cache_it_reports():
    config = RunnerConfig(device="cpu", num_kv_blocks=12, max_model_len=64, block_size=8)
    runner = ModelRunner(config, ModelSpec())
    assert runner.kv_caches is None
    assert start_up(runner) == 12
    args = runner.model_args
    assert len(runner.kv_caches) == args.num_hidden_layers
    assert runner.kv_caches[0].shape[:3] == (2, 12, 8)
    assert runner.info.num_kv_blocks == 12
    kv_bytes = sum(kv.numel() * kv.element_size() for kv in runner.kv_caches)
    assert runner.info.kv_cache_bytes == kv_bytes
    assert runner.graph_runner is None  # nothing to capture on the CPU


def test_a_profiling_run_says_so_and_its_triton_attention_computes_no_scores(monkeypatch):
    """``profile_run``'s batches are profiling batches (the warm-up's are not). Without a KV
    cache, the Triton path's attention gives a profiling batch zeros of the query's shape (its
    output, no [heads, tokens, tokens] scores: no step of the run allocates those) and never the
    torch reference; a batch that does not profile still gets the reference, and so does the
    torch path (its steps attend through it too)."""
    import mrv2_prof.runner.model.attention_triton as attention_triton
    import mrv2_prof.runner.worker.model_runner as model_runner
    from mrv2_prof.runner.model.attention import paged_attention_ref
    from mrv2_prof.runner.worker.kernel_set import triton_kernels

    # the Triton kernels in the interpreter (a CPU run takes the torch ones)
    monkeypatch.setattr(model_runner, "resolve_kernels", lambda r, c: (triton_kernels(), None))
    config = RunnerConfig(
        device="cpu", num_kv_blocks=16, max_model_len=64, max_num_seqs=4, uva=False
    )
    runner = ModelRunner(config, ModelSpec())
    assert runner.model.kernels.name == "triton"
    seen = []
    run_dummy = runner.run_dummy
    monkeypatch.setattr(
        runner, "run_dummy", lambda batch, kv: seen.append(batch.profiling) or run_dummy(batch, kv)
    )
    calls = []

    def counted_ref(*args):
        calls.append(args[4].num_tokens)
        return paged_attention_ref(*args)

    monkeypatch.setattr(attention_triton, "paged_attention_ref", counted_ref)
    profile_run(runner)
    assert seen == [True, True] and calls == []  # the 63-token chunk and the 4-request batch
    initialize_kv_cache(runner)
    dummy_run(runner, 7, 3, with_kv_cache=True)
    assert seen[2:] == [False]
    batch = dummy_batch(9, 2, 4, CPU, runner.block_tables, profiling=True)
    meta = batch.attn_metadata(8)
    q = torch.randn(9, 4, 16)
    k = v = torch.randn(9, 2, 16)
    out = attention_triton.paged_attention_triton(q, k, v, None, meta, 0.25)
    assert out.shape == q.shape and not out.any() and calls == []
    meta.profiling = False  # not a profiling run: the reference, whose values it returns
    torch.testing.assert_close(
        attention_triton.paged_attention_triton(q, k, v, None, meta, 0.25),
        paged_attention_ref(q, k, v, None, meta, 0.25),
    )
    assert calls == [9]
