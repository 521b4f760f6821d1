"""The memory plan and the KV pool's size (``memory_plan``, ``kv_sizing``): on a GPU, a profiled
forward's peak, the graphs' memory and the decodes' gather budget; on a CPU, the budget asked.
"""
