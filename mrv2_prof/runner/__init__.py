"""The embedded inference runner, following vLLM's Model Runner V2 (``vllm/v1/worker/gpu/``).

``engine`` (the step loop) and ``config`` (its one config) sit on top of three wings, split as vLLM
splits them: ``core/`` (request, scheduler, KV-cache manager, block pool), ``worker/`` (the model
runner and the MRV2 mechanisms beside it) and ``model/`` (the decoder, its loader, attention and
the fused kernels). ``spec_decode/`` is reserved for speculative decoding. The map and the import
rules are in docs/architecture.md.
"""
