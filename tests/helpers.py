"""Test helpers: tiny random models with their transformers twins, direct forwards, near-tie checks.

Imported by the test modules as ``helpers`` (pytest puts ``tests/`` on ``sys.path``).
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable
from collections.abc import Sequence as Seq

import torch

from minieng import EngineConfig, LLMEngine, ModelConfig, SamplingParams
from minieng.engine.chat_template import chat_token_ids
from minieng.core.sequence import Sequence, SequenceStatus
from minieng.model.loader import LoadedModel, build_model

# -- tiny random models ---------------------------------------------------------------------------

TINY_SHAPE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=300,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    # Larger than the default 0.02, so random logits are spread out and greedy
    # choices are rarely near-ties.
    initializer_range=0.08,
)

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 10000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}

# "llama3_rope" is tested on its own (test_model_parity.py): build_model cannot build it yet.
TINY_KINDS = ("llama", "llama_tied", "llama_bias_head_dim", "mistral", "qwen2", "qwen2_tied")


def tiny_hf_config(kind: str):
    """A transformers config of a tiny decoder of one supported architecture."""
    from transformers import LlamaConfig, MistralConfig, Qwen2Config

    shape = dict(TINY_SHAPE)
    if kind == "llama":
        return LlamaConfig(**shape, tie_word_embeddings=False)
    if kind == "llama_tied":
        return LlamaConfig(**shape, tie_word_embeddings=True)
    if kind == "llama3_rope":
        return LlamaConfig(**shape, tie_word_embeddings=False, rope_parameters=dict(LLAMA3_ROPE))
    if kind == "llama_bias_head_dim":
        # q/k/v/o and MLP biases, and head_dim * heads (128) != hidden_size (64).
        return LlamaConfig(**shape, tie_word_embeddings=False, attention_bias=True, mlp_bias=True, head_dim=32)
    if kind == "mistral":
        return MistralConfig(**shape, tie_word_embeddings=False)
    if kind == "qwen2":
        return Qwen2Config(**shape, tie_word_embeddings=False)
    if kind == "qwen2_tied":
        return Qwen2Config(**shape, tie_word_embeddings=True)
    raise ValueError(kind)


def tiny_hf_model(hf_config, seed: int = 0):
    """A transformers model of ``hf_config`` with seeded random fp32 weights, eager attention."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    hf_config._attn_implementation = "eager"  # the plain math path as the reference
    return AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32).eval()


def tiny_pair(hf_config, seed: int = 0):
    """(transformers model, minieng ``LoadedModel``) with the same random fp32 weights."""
    hf = tiny_hf_model(hf_config, seed)
    config = ModelConfig.from_hf(hf_config)
    model = build_model(config, torch.float32, torch.device("cpu"), hf_config.max_position_embeddings)
    model.load_weights(hf.state_dict().items())
    return hf, LoadedModel(model, None, hf_config, set(), None)


def make_engine(loaded: LoadedModel, **overrides) -> LLMEngine:
    """An engine over a tiny model: small blocks (more block boundaries), CPU."""
    fields = dict(device="cpu", block_size=4, num_kv_blocks=256, max_model_len=256)
    fields.update(overrides)
    return LLMEngine(EngineConfig(**fields), loaded=loaded)


def random_prompts(lengths: Seq[int], vocab: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lengths]


# -- references -----------------------------------------------------------------------------------


@torch.no_grad()
def hf_logits(hf_model, ids: Seq[int]) -> torch.Tensor:
    """transformers' logits at every position of ``ids``: [len(ids), vocab] float32."""
    return hf_model(torch.tensor([list(ids)])).logits[0].float()


def hf_next_logits(hf_model) -> Callable[[Seq[int]], torch.Tensor]:
    return lambda ids: hf_logits(hf_model, ids)[-1]


@torch.no_grad()
def hf_greedy(hf_model, prompt: Seq[int], max_new_tokens: int) -> list[int]:
    """transformers ``generate`` greedy, exactly ``max_new_tokens`` tokens, EOS not special.

    ``eos_token_id=None`` rather than ``min_new_tokens``: the latter masks EOS out of the logits,
    which changes the argmax; minieng's ``ignore_eos`` keeps EOS as a choice and goes on.
    """
    out = hf_model.generate(
        torch.tensor([list(prompt)]),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
    )
    return out[0, len(prompt) :].tolist()


@torch.no_grad()
def hf_greedy_batch(hf_model, prompts: Seq[Seq[int]], max_new_tokens: int) -> list[list[int]]:
    """``hf_greedy`` of several prompts in one ``generate`` call: left-padded (id 0, masked out),
    as transformers batches a decoder. A prompt's tokens equal ``hf_greedy``'s up to fp32 rounding
    (the padded batch's products round differently), a few times faster than one call per prompt."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + list(p) for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    out = hf_model.generate(
        ids, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0, attention_mask=mask
    )
    return out[:, width:].tolist()


def chat_ids(tokenizer, text: str) -> list[int]:
    """A user turn through the chat template, generation prompt added, as a list of ids."""
    return chat_token_ids(tokenizer, text)


BOS_ID = 1


def bos_tokenizer():
    """A tiny offline tokenizer that adds BOS, as Llama 3's does: a word-level vocabulary of 300
    (the tiny models' size; ids 5.. are "w5", "w6", ...), a post-processor putting ``<s>`` (id 1)
    in front of every encoded text, and a chat template that starts with ``<s>`` as well."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>"] + [f"w{i}" for i in range(5, 300)]
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", BOS_ID)])
    tok = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    tok.add_special_tokens({"additional_special_tokens": ["<|user|>", "<|assistant|>"]})
    tok.chat_template = (
        "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
        "{% if add_generation_prompt %}<|assistant|> {% endif %}"
    )
    return tok


def assert_same_or_near_tie(
    expected: Seq[int],
    actual: Seq[int],
    prompt: Seq[int],
    next_logits: Callable[[Seq[int]], torch.Tensor],
    what: str = "",
    tol: float = 1e-3,
) -> int | None:
    """Assert two greedy outputs are equal, or that they first differ at an exact near-tie.

    On a divergence at output position i, the reference logits after ``prompt + expected[:i]``
    must rank both diverging tokens within ``tol`` of the best logit (so the top-2 gap is < tol):
    two correct fp32 computations may then round to different argmaxes. Anything else fails.
    Returns the divergence position (None when identical); a divergence is reported as a warning.
    """
    expected, actual = list(expected), list(actual)
    for i, (a, b) in enumerate(zip(expected, actual)):
        if a == b:
            continue
        logits = next_logits(list(prompt) + expected[:i])
        best = logits.max().item()
        gap_a, gap_b = best - logits[a].item(), best - logits[b].item()
        top2 = logits.topk(2).values
        assert max(gap_a, gap_b) < tol, (
            f"{what}: outputs diverge at output position {i} ({a} vs {b}) and it is no near-tie: "
            f"reference logit gaps to the best {gap_a:.3g} and {gap_b:.3g} (top-2 gap "
            f"{(top2[0] - top2[1]).item():.3g}, tolerance {tol})"
        )
        warnings.warn(
            f"{what}: near-tie divergence at output position {i} ({a} vs {b}); "
            f"top-2 gap {(top2[0] - top2[1]).item():.2e}",
            stacklevel=2,
        )
        return i
    assert len(expected) == len(actual), f"{what}: same tokens but lengths {len(expected)} != {len(actual)}"
    return None


# -- direct forwards through the engine's runner ---------------------------------------------------


class DirectRunner:
    """Drives an engine's model without the scheduler, to read logits at any row.

    The caller plays the scheduler: it decides ``(sequence, new tokens)`` pairs (decodes first);
    this allocates blocks, lays the batch out (``ModelRunner.layout``, ``tensors``), runs the model and
    advances ``num_computed_tokens``.
    """

    def __init__(self, engine: LLMEngine):
        self.engine = engine
        self._ids = itertools.count()

    def new_seq(self, prompt: Seq[int]) -> Sequence:
        seq = Sequence(f"direct-{next(self._ids)}", list(prompt), SamplingParams(temperature=0), 0.0)
        seq.status = SequenceStatus.RUNNING
        return seq

    def step(self, scheduled: list[tuple[Sequence, int]], every_row: bool = False) -> torch.Tensor:
        """Logits [rows, vocab]: every row of the batch, or only where the runner samples."""
        for seq, n in scheduled:
            self.engine.block_manager.allocate(seq, n)
        runner = self.engine.runner
        runner.kv_cache.zero_blocks(self.engine.block_manager.take_fresh_blocks())
        input_ids, positions, meta, logits_indices = runner.tensors(runner.layout(scheduled))
        if every_row:
            logits_indices = torch.arange(len(input_ids))
        logits = self.engine.model(input_ids, positions, self.engine.kv_cache, meta, logits_indices)
        for seq, n in scheduled:
            seq.num_computed_tokens += n
        return logits

    def prefill(self, seq: Sequence, chunks: Seq[int] | None = None) -> torch.Tensor:
        """Prefill the prompt in the given chunk sizes; logits at every prompt position."""
        chunks = list(chunks or [seq.num_prompt_tokens])
        assert sum(chunks) == seq.num_prompt_tokens
        return torch.cat([self.step([(seq, n)], every_row=True) for n in chunks])

    def decode(self, seqs: Seq[Sequence], tokens: Seq[int]) -> torch.Tensor:
        """Append one token to each sequence and run them as one batch of decodes."""
        for seq, tok in zip(seqs, tokens):
            seq.output_token_ids.append(tok)
        return self.step([(seq, 1) for seq in seqs])


# -- invariance: outputs that must not depend on how the engine runs a request ---------------------

REAL_TEXTS = [
    "Hi!",
    "What is 2 + 2?",
    "Name a color.",
    "Write one sentence about cats.",
    "Why do leaves change color in autumn? Explain it to a ten-year-old.",
    "Translate 'good morning' into French, Spanish and German.",
    "Summarize the plot of Romeo and Juliet in three sentences, without spoilers about the ending if you can.",
    "Give me three tips for writing clear Python code.",
    "What is the difference between a list and a tuple in Python? Please give a short example of each, "
    "and mention when you would prefer one over the other.",
    "Tell me a joke about computers.",
    "How many legs does a spider have?",
    "Describe the water cycle: evaporation, condensation, precipitation and collection. Keep it short but "
    "make sure every stage is mentioned, and say where the energy that drives the cycle comes from.",
    "Suggest a name for a small bakery.",
    "What does a CPU do?",
    "Write a limerick about a cat who learned to program in Rust and never had a memory bug again.",
    "List the planets of the solar system in order from the sun.",
    "Is a tomato a fruit or a vegetable?",
]


def check_all(prompts, references, outputs, next_logits, what):
    assert len(outputs) == len(prompts)
    for i, (prompt, ref, out) in enumerate(zip(prompts, references, outputs)):
        assert out.prompt_token_ids == list(prompt), f"{what}: outputs out of order"
        assert out.finished
        assert_same_or_near_tie(ref, out.token_ids, prompt, next_logits, what=f"{what}, request {i}")


def check_budget(engine: LLMEngine):
    """Every step within max_num_seqs and the token budget (a prompt longer than the budget may
    run alone when chunked prefill is off). The policies themselves are tested in test_scheduler."""
    cfg = engine.config
    for rec in engine.step_records:
        assert len(rec.chunks) <= cfg.max_num_seqs
        tokens = sum(n for n, _, _ in rec.chunks)
        alone = not cfg.enable_chunked_prefill and len(rec.chunks) == 1
        assert tokens <= cfg.max_num_batched_tokens or alone, f"{tokens} tokens in a step: {rec}"


def num_split_prompts(engine: LLMEngine) -> int:
    """Prefill chunks that stopped before the end of their sequence (they sample nothing)."""
    return sum(1 for rec in engine.step_records for _, _, num_logits_rows in rec.chunks if not num_logits_rows)
