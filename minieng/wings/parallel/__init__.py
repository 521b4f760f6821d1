"""Tensor parallelism as a transform of a built model (``tensor_parallel.RankShard``, Megatron's
split), the worker processes that run rank 0's layouts in lockstep (``workers``), and the KV
hand-off of disaggregated prefill and decode (``kv_transfer``).
"""
