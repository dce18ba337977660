"""Speculative decoding, MRV2-style: the settings (``config``: ``runner.spec_decode``), the
n-gram drafter (``ngram_proposer``), the rejection sampler (``rejection_sampler``: the torch
reference; ``rejection_sampler_triton``: the kernels) and the runner's verify step (``verify``).
The scheduler's side (drafts, lookahead slots, padding a uniform decode batch to one k, accepted
runs) is ``runner/core/spec_scheduling``; the FULL verify graphs under dynamic k are the
CUDA-graph manager's. Not built: the draft-model
drafter and its fused draft graph (``method: draft_model`` is refused)."""
