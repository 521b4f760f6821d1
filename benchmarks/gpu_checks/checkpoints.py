"""The shapes the GPU check runs, the sizes of its runs, and random-weight checkpoints of those shapes.

A checkpoint is a Hugging Face folder made on the device (transformers' ``from_config`` +
``save_pretrained``) with a byte-level tokenizer, so transformers and minieng read the same
weights and every check can cut its prompts from the project's text. Random weights: speed does
not depend on weight values.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from pathlib import Path

import torch

GREEDY = dict(temperature=0, ignore_eos=True)  # SamplingParams fields: every run decodes its full length

# A table: one shape a row reads better than one field a line.
# fmt: off
SHAPES = {  # transformers LlamaConfig fields; max_position_embeddings raised for 16k prompts
    "smollm2-135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True, rope_theta=100000.0),
    "smollm2-1.7b": dict(vocab_size=49152, hidden_size=2048, intermediate_size=8192, num_hidden_layers=24,
                         num_attention_heads=32, num_key_value_heads=32, tie_word_embeddings=True, rope_theta=130000.0),
    "llama-7b-hd64": dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                          num_attention_heads=64, num_key_value_heads=16, tie_word_embeddings=False, rope_theta=500000.0),
}
# fmt: on
TINY = dict(  # what every shape becomes in smoke mode
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    tie_word_embeddings=False,
)
DUMMY_WEIGHTS = ("llama-7b-hd64",)  # shapes run with load_format="dummy": no weights written (too large to save)


@dataclass(frozen=True)
class CheckSizes:
    """How large each check's runs are (tokens, batch sizes, repeats)."""

    max_position: int  # the checkpoints' max_position_embeddings
    prefill_lens: list[int]  # prompt lengths timed for TTFT and prefill MFU
    batches: list[int]  # decode batch sizes timed for TPOT and MBU
    decode_context: int  # prompt tokens of each decoding sequence, batches up to 64
    big_batch_context: int  # the same, batches over 64
    output_tokens: int  # tokens generated per timed decode
    prefix_tokens: int  # the prefix cache's prompt length
    prefix_shares: list[float]  # shares of the prompt shared between requests
    spec_ks: list[int]  # speculative tokens per step
    nvml_seconds: float  # how long a decode runs under NVML sampling
    repeats: int  # timed runs per point (their median is reported)
    quant_prompt: int  # the quantization check's prompt tokens
    quant_batches: list[int]  # the quantization check's decode batch sizes
    greedy_tokens: int  # greedy tokens compared with transformers
    quality_tokens: int  # tokens per quality prompt, quantized against bf16


FULL = CheckSizes(
    max_position=16384 + 512,
    prefill_lens=[512, 4096, 16384],
    batches=[1, 8, 64, 256],
    decode_context=1024,
    big_batch_context=512,
    output_tokens=32,
    prefix_tokens=16384,
    prefix_shares=[0.0, 0.5, 0.9, 0.97],
    spec_ks=[1, 2, 4],
    nvml_seconds=4.0,
    repeats=3,
    quant_prompt=4096,
    quant_batches=[1, 16],
    greedy_tokens=32,
    quality_tokens=32,
)
SMOKE = CheckSizes(  # every check in seconds on tiny shapes: the code runs, the figures mean nothing
    max_position=512,
    prefill_lens=[16, 64],
    batches=[1, 2],
    decode_context=16,
    big_batch_context=16,
    output_tokens=4,
    prefix_tokens=64,
    prefix_shares=[0.0, 0.5],
    spec_ks=[1, 2],
    nvml_seconds=0.0,
    repeats=1,
    quant_prompt=64,
    quant_batches=[1, 2],
    greedy_tokens=8,
    quality_tokens=8,
)


def byte_tokenizer():
    """A byte-level tokenizer (one token per byte, ids 0-255, EOS 256): text in, ids every shape accepts."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    vocab["</s>"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>")


def make_checkpoint(directory: Path, shape: dict, max_position: int, device: torch.device, weights: bool) -> Path:
    """A Hugging Face folder: config, tokenizer and (``weights=True``) random weights made on
    ``device`` (bf16 on CUDA, fp32 elsewhere; the same weights on every run). Without weights,
    engines load it with ``load_format="dummy"``. Returns ``directory``."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    directory.mkdir(parents=True, exist_ok=True)
    config = LlamaConfig(
        **shape,
        max_position_embeddings=max_position,
        rms_norm_eps=1e-5,
        initializer_range=0.05,
        eos_token_id=256,
        bos_token_id=None,
        pad_token_id=None,
    )
    config.save_pretrained(directory)
    byte_tokenizer().save_pretrained(directory)
    if weights:
        torch.manual_seed(0)  # the same random weights on every run
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(
                config, dtype=torch.bfloat16 if device.type == "cuda" else torch.float32
            )
        model.save_pretrained(directory)
        del model
    return directory


def release() -> None:
    """Return freed memory to the device, after the caller dropped its engines (``del``), so the
    next engine sizes its KV pool from a free device."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def cpu_pool(device: torch.device) -> dict:
    """``EngineConfig`` fields for the KV pool: 0.25 GiB on a CPU (enough for the check's runs);
    none on a GPU, whose pool is sized from the device's free memory."""
    return {"kv_cache_memory_gib": 0.25} if device.type == "cpu" else {}
