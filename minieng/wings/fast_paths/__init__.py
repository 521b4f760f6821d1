"""Fast paths: the model runner's forward strategy (``strategy.FastPaths``, set as ``ModelRunner.fast``).

CUDA graphs of the decode step (``cuda_graph``), ``compile=True``'s compiled step and regions
(``compilation``, ``compiled_decode``, ``opaque_ops``), the Triton paged-attention kernel
(``triton_attention``), and the named fallback of each (``forward_paths``).
"""
