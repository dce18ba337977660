"""Speculative decoding, MRV2-style. Built so far: the n-gram drafter (``ngram_proposer``) and
the rejection sampler (``rejection_sampler``: the torch reference; ``rejection_sampler_triton``:
the kernels). Not built yet: the draft-model drafter and its fused draft graph, the verify step in
the model runner, lookahead slots in the scheduler, dynamic k, and the probes and views; the
``runner.spec_decode`` scenario keys do not exist until they are."""
