"""Tensor parallelism: the rank's shard of a model and the collectives its layers call."""
