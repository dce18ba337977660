"""Speculative decoding, MRV2-style, nested under the worker as vLLM nests it
(``vllm/v1/worker/gpu/spec_decode/``): the device n-gram drafter (``ngram_device``, its kernel
``ngram_triton``, kept by ``device_drafts``), the draft model (``draft_model``, ``draft_proposer``,
``draft_runner``, ``draft_graph``), the rejection sampler (``rejection_sampler``: the torch
reference; ``rejection_sampler_triton``: the kernels) and the runner's verify step (``verify``).
It builds on the worker's pieces (input batch, sampler, UVA, request states); the model runner
and its step pieces call it. The settings are ``SpecDecodeConfig`` in ``runner/config.py``; the
scheduler's side (drafts, lookahead slots, padding a uniform decode batch to one k, accepted
runs) is ``runner/core/spec_scheduling``, with the host n-gram drafter ``core/ngram_proposer``;
the FULL verify graphs under dynamic k are the CUDA-graph manager's."""
