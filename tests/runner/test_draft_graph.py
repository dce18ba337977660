"""The fused draft graph's replay path on the CPU: ``DraftGraphs`` with stand-in graphs whose
replay runs the captured body (the catch-up when every request computed q tokens, then the k
draft steps, over the static buffers, padded to the capture size with the scratch row) gives
the eager path's greedy tokens and drafts; a batch it cannot
replay (k not captured, too many requests) says why and drafts eagerly. The CUDA capture itself
is ``test_spec_decode_draft_model_gpu.py``."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from test_spec_decode import run_greedy
from test_spec_decode_draft_model import self_draft

from mrv2_prof.runner.config import SpecDecodeConfig
from mrv2_prof.runner.worker import model_runner
from mrv2_prof.runner.worker.spec_decode.draft_graph import DraftGraphs


def with_stand_in_graphs(sizes: list[int], ks: list[int]):
    """Patch ``make_drafter`` so every drafter gets DraftGraphs whose graphs run eagerly."""
    made = []
    original = model_runner.make_drafter

    def make(runner, spec):
        drafter = original(runner, spec)
        graphs = DraftGraphs(drafter.state, sizes, ks, torch.device("cpu"))
        for size in graphs.sizes:
            for k in graphs.ks:
                for sampled in (True, False):
                    for q in graphs.qs[k]:
                        body = graphs._body(size, k, sampled, q)
                        graphs.graphs[(size, k, sampled, q)] = SimpleNamespace(replay=body)
        drafter.graphs = graphs
        made.append(drafter)
        return drafter

    return make, made


def test_replayed_draft_steps_give_the_eager_tokens(monkeypatch):
    plain, _ = run_greedy(SpecDecodeConfig())
    eager, eager_engine = run_greedy(self_draft(2))
    make, made = with_stand_in_graphs([1, 2, 3, 8], [2])
    monkeypatch.setattr(model_runner, "make_drafter", make)
    tokens, engine = run_greedy(self_draft(2))
    assert tokens == plain == eager
    drafter = made[0]
    assert drafter.num_eager == 0 and drafter.notes == []
    replays = drafter.graphs.replays
    assert sum(replays.values()) > 0 and {k for _, k, _, _ in replays} == {2}
    assert {size for size, *_ in replays} <= {1, 2, 3, 8}
    assert 8 in {size for size, *_ in replays}  # 4 requests padded up to 8
    # decode steps ran their catch-up inside the graph (q = 1), so did verifies where every
    # request drafted k (q = 1 + k); steps with a prefill chunk or unequal drafts ran it eagerly
    # first (q = 0); all gave the eager drafts
    assert {q for *_, q in replays} == {0, 1, 3}
    # the same drafts, so the same verifies
    assert engine.scheduler.spec.stats == eager_engine.scheduler.spec.stats


def test_a_batch_the_graphs_cannot_hold_drafts_eagerly_and_says_why(monkeypatch):
    plain, _ = run_greedy(SpecDecodeConfig())
    make, made = with_stand_in_graphs([1, 2], [3])
    monkeypatch.setattr(model_runner, "make_drafter", make)
    tokens, _ = run_greedy(self_draft(2))
    assert tokens == plain
    drafter = made[0]
    assert drafter.num_eager > 0 and sum(drafter.graphs.replays.values()) == 0
    assert drafter.notes == ["draft graph: k=2 was not captured (captured [3]); eager"]
    graphs = drafter.graphs
    one = torch.zeros(3, dtype=torch.int64)
    out, reason = graphs.replay(one, one, one, one.float(), one, 3, False)
    assert out is None and reason == "draft graph: 3 requests > largest capture size 2; eager"
