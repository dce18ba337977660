"""Speculative decoding (drafters, rejection sampler, draft graphs): reserved, not built yet."""
