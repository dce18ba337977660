"""The embedded inference runner, following vLLM's Model Runner V2 (``vllm/v1/worker/gpu/``).

One module per mechanism: ``request`` (request lifecycle), ``block_pool`` and
``kv_cache_manager`` (paged KV cache with prefix caching), ``scheduler`` (V1 engine scheduler),
``staged_write`` (StagedWriteTensor), ``request_states`` (fixed slots), ``block_table``,
``input_batch`` (GPU-side input preparation), ``attention``, ``model``/``model_loader``,
``sampler``, ``model_runner`` and ``engine`` (the step loop).
"""
