"""What the engine hands out: a request's state after a step, and the record of each step.

Plain data, read by the instruments (``metrics``, ``work``, ``replay``, ``plots``) without
depending on the engine that wrote them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minieng.engine.sequence import RequestTimes


@dataclass(frozen=True)
class Logprob:
    """One token's log-probability at one position (vLLM's ``Logprob``).

    Attributes:
        logprob: natural log of its probability under the model's raw logits (<= 0).
        rank: 1 for the most likely token, counting ties as vLLM does (the tokens whose
            log-probability is >= this one's).
        decoded_token: the tokenizer's decode of this single id, or None without a tokenizer.
    """

    logprob: float
    rank: int
    decoded_token: str | None = None


# vLLM's names: one dict per generated token; one per prompt token, the first None.
SampleLogprobs = list[dict[int, Logprob]]
PromptLogprobs = list[dict[int, Logprob] | None]


@dataclass
class RequestOutput:
    """A request's state after a step: ``new_token_ids``/``delta`` are what this step added.

    Log-probabilities (``engine/logprobs.py``: raw log_softmax, before temperature, top-k and
    top-p), None unless the request asked (``SamplingParams.logprobs``, ``prompt_logprobs``):

    - ``logprobs``: one ``{token id: Logprob}`` per token of ``token_ids`` (vLLM's
      ``CompletionOutput.logprobs``): the generated token and the top ``logprobs`` tokens;
      ``new_logprobs``: those of ``new_token_ids`` alone (what a stream sends on).
    - ``prompt_logprobs``: one per prompt token, the first None (nothing predicts it), as vLLM's
      ``RequestOutput.prompt_logprobs``: the prompt's token and the top ``prompt_logprobs``
      tokens at each position. Complete from the first output on (the prompt is computed then).
    """

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
    logprobs: SampleLogprobs | None = None
    new_logprobs: SampleLogprobs | None = None
    prompt_logprobs: PromptLogprobs | None = None


@dataclass
class StepRecord:
    """The composition and duration of one step (synchronized on CUDA).

    ``chunks`` lists, per scheduled sequence (decodes first), ``(num_new_tokens,
    num_context_tokens, num_logits_rows)``: the tokens run this step, the tokens already in the
    KV cache before them, and the rows the LM head ran on (0 for a prompt chunk that stops
    mid-prompt, 1, or k + 1 for a decode verifying k drafts; plus, for a request asking
    ``prompt_logprobs``, one per prompt position whose log-probability the step computed). FLOPs and bytes of the step follow
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
    # How the forward ran (``forward_paths.FORWARD_PATHS``): "cuda_graph", "compiled_step",
    # "compiled_regions" or "eager".
    forward_path: str = "eager"
    # Per request admitted for the first time this step (a preempted one's readmission is not):
    # (prompt tokens looked up in the prefix cache, tokens it served), vLLM's PrefixCacheStats
    # queries and hits, the source of the logged "Prefix cache hit rate" (``logged_throughput``).
    # A request asking prompt_logprobs reads no cache, and is left out, as vLLM leaves it out.
    prefix_cache_lookups: list[tuple[int, int]] = field(default_factory=list)

    @property
    def graphed(self) -> bool:
        """Whether the forward replayed a captured CUDA graph."""
        return self.forward_path == "cuda_graph"
