"""The inference engine: ``LLMEngine`` and what it is built from (config checks, model loading, memory plan, KV sizing), the scheduler and
block manager (policy and accounting, no tensors), sequences and outputs, the model runner and its CUDA
graphs, sampling and log-probabilities, speculative decoding's drafters and verification, text in and out, KV transfer.
Imports ``model`` and the root leaves; never the instruments, the lessons, the server or the course.
"""
