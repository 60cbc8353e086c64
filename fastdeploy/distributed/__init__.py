"""Tensor parallelism: the rank group a model computes in (`parallel_state`) and how a checkpoint
is cut into per-rank shards (`sharding`)."""
