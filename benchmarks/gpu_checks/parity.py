"""Parity with transformers on the same checkpoint: the last logits and the greedy tokens, fp32 and bf16.

Greedy agreement on random weights mostly measures near-ties (random logits are close together),
which is why each row reports the largest logit difference beside the logits' spread.
"""

from __future__ import annotations

from pathlib import Path

import torch

from minieng.config import SamplingParams
from minieng.engine.llm_engine import LLMEngine
from minieng.core.sequence import Sequence
from .checkpoints import GREEDY, CheckSizes, release
from minieng.measure.workloads import text_prompts


def parity(path: Path, device: torch.device, sizes: CheckSizes) -> list[dict]:
    """minieng against transformers on the checkpoint at ``path``, one row per dtype (float32,
    bfloat16): ``max_abs_logit_diff`` and ``logit_std`` (the reference's last logits after a
    64-token prompt), ``greedy_tokens_agreeing`` of ``greedy_tokens``."""
    from transformers import AutoModelForCausalLM  # lazy: transformers takes seconds to import

    rows = []
    for dtype in ("float32", "bfloat16"):
        engine = LLMEngine(
            model=str(path),
            dtype=dtype,
            device=str(device),
            kv_cache_memory_gib=2.0,
            max_model_len=min(1024, sizes.max_position),
        )
        hf = AutoModelForCausalLM.from_pretrained(path, dtype=engine.dtype).to(device).eval()
        prompt = text_prompts(engine.tokenizer, 64, 1)[0]
        with torch.no_grad():
            ref = hf(torch.tensor([prompt], device=device)).logits[0, -1].float()
        n = sizes.greedy_tokens
        ours = engine.generate([prompt], SamplingParams(max_tokens=n, **GREEDY))[0].token_ids
        theirs = reference_greedy(hf, prompt, n)
        logits = last_logits(engine, prompt)
        rows.append(
            {
                "dtype": dtype,
                "max_abs_logit_diff": (logits - ref).abs().max().item(),
                "logit_std": ref.std().item(),
                "greedy_tokens_agreeing": greedy_agreement(ours, theirs),
                "greedy_tokens": n,
            }
        )
        del engine, hf
        release()
    return rows


@torch.no_grad()
def reference_greedy(hf, prompt: list[int], n: int) -> list[int]:
    """transformers' model's ``n`` greedy tokens after ``prompt``, through EOS and every stop
    (``generate`` ends at the checkpoint's EOS whatever it is told, and minieng's side ignores EOS:
    both must run the same number of tokens to be compared)."""
    device = next(hf.parameters()).device
    tokens: list[int] = []
    for _ in range(n):  # the whole sequence each time: no cache API that changes between versions
        tokens.append(int(hf(torch.tensor([prompt + tokens], device=device)).logits[0, -1].argmax()))
    return tokens


def greedy_agreement(ours: list[int], theirs: list[int]) -> int:
    """Leading tokens the two greedy runs share. Raises ``ValueError`` for runs of different
    lengths (a reference that stopped early would read as full agreement)."""
    if len(ours) != len(theirs):
        raise ValueError(f"greedy runs of {len(ours)} and {len(theirs)} tokens: compare runs of the same length")
    return next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), len(ours))


def last_logits(engine: LLMEngine, prompt: list[int]) -> torch.Tensor:
    """minieng's logits [vocab] after ``prompt`` (a throwaway sequence through the runner)."""
    seq = Sequence("parity", prompt, SamplingParams(temperature=0), 0.0)
    engine.block_manager.allocate(seq, len(prompt))
    runner = engine.runner
    logits = runner.run_layout(runner.layout([(seq, len(prompt))]), engine.block_manager.take_fresh_blocks())
    engine.block_manager.free(seq)
    return logits[-1]
