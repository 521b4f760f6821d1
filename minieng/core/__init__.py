"""The plain engine: requests in, tokens out, one step at a time. It imports no feature.

Read in this order: ``engine_core`` (the step), ``scheduler`` (continuous batching, chunked
prefill, preemption), ``block_manager`` (blocks and the prefix cache), ``sequence``,
``model_runner`` (``prefill``, ``decode``, sampling), ``llama`` (the model), ``attention`` (SDPA
over the paged KV cache), ``kv_cache``, ``sampling``, ``outputs`` (stop checks, text, records).
Every feature is a wing (``minieng.wings``) that ``minieng.engine.llm_engine`` attaches at a seam.
"""
