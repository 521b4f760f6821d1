"""What the engine hands out: a request's state after a step, and the record of each step.

Plain data, read by the instruments (``metrics``, ``work``, ``replay``, ``plots``) without
depending on the engine that wrote them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minieng.engine.sequence import RequestTimes


@dataclass
class RequestOutput:
    """A request's state after a step: ``new_token_ids``/``delta`` are what this step added."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    new_token_ids: list[int]
    text: str
    delta: str
    finished: bool
    finish_reason: str | None
    times: RequestTimes
    num_cached_tokens: int = 0  # prompt tokens the prefix cache served


@dataclass
class StepRecord:
    """The composition and duration of one step (synchronized on CUDA).

    ``chunks`` lists, per scheduled sequence (decodes first), ``(num_new_tokens,
    num_context_tokens, num_logits_rows)``: the tokens run this step, the tokens already in the
    KV cache before them, and the rows the LM head ran on (0 for a prompt chunk that stops
    mid-prompt, 1, or k + 1 for a decode verifying k drafts). FLOPs and bytes of the step follow
    from it (``flops_bytes.step_work``). Built by keyword (``LLMEngine.step``).
    """

    start_s: float
    duration_s: float
    num_prefill_tokens: int
    num_prefill_seqs: int
    num_decode_seqs: int
    num_preempted: int
    num_running: int
    num_waiting: int
    num_used_blocks: int
    chunks: list[tuple[int, int, int]] = field(default_factory=list)
    num_evictions: int = 0  # prefix-cache evictions so far (cumulative: a run's is last - first)
    draft_s: float = 0.0  # of duration_s, the time the drafter took to propose
    forward_s: float = 0.0  # of duration_s, the target model's forward pass alone
    comm_s: float = 0.0  # of forward_s, rank 0's time in tensor-parallel collectives (0 on one rank)
    graphed: bool = False  # the forward replayed a captured CUDA graph
    # Per request admitted for the first time this step (a preempted one's readmission is not):
    # (prompt tokens looked up in the prefix cache, tokens it served), vLLM's PrefixCacheStats
    # queries and hits, the source of the logged "Prefix cache hit rate" (``logged_throughput``).
    prefix_cache_lookups: list[tuple[int, int]] = field(default_factory=list)
