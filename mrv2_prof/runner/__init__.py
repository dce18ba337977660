"""The embedded inference runner, following vLLM's Model Runner V2 (``vllm/v1/worker/gpu/``).

The folders form a tree, top to bottom: ``engine`` (the step loop) over ``worker/`` (the model
runner and the MRV2 mechanisms beside it, speculative decoding nested in ``worker/spec_decode/``
as vLLM nests it), which uses ``parallel/`` (tensor parallelism), ``core/`` (request, scheduler,
KV-cache manager, block pool) and ``model/`` (the decoder, its loader, attention and the fused
kernels); ``config`` (every setting) sits at the bottom and imports none of them. The map and
the import rules are in docs/architecture.md.
"""
