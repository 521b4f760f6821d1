"""The features, each attached to the core at one seam by ``minieng.engine.llm_engine``:

- ``fast_paths``: the runner's forward strategy (``ModelRunner.fast``): CUDA graphs,
  ``compile=True``'s compiled step and regions, the Triton decode kernel, opaque operators;
- ``speculative``: a proposer before each schedule and verification in place of sampling
  (``EngineCore.speculator``, ``ModelRunner.verify``);
- ``parallel``: tensor parallelism as a transform of a built model (``RankShard``), the workers
  that run rank 0's layouts in lockstep (``ModelRunner.run_layout``), the KV hand-off;
- ``quantization``: a swap of a built model's linear layers;
- ``logprobs``: a hook on the logits the runner samples (``ModelRunner.logprobs``);
- ``gpu_memory``: the memory plan and the KV pool's size on a GPU (profiling, gather budget).
"""
