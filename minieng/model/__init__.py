"""The network and its tensors: the Llama-family decoder (``llama``), paged attention, the KV pool's
tensors, the loader, the weights' bytes and quantization (integer codes, kernels, policy). Imports only
the root leaves (``config``, ``device``): never the engine, the instruments or the course.
"""
