"""Which length each phase's cost follows: prefill the prompt's, decode the answer's.

Three requests on one engine: a short prompt with a short answer, the same answer after a long
prompt, and the short prompt with a long answer. Each is timed as TTFT (the prefill, from
arrival) and decode time (E2EL - TTFT: every step after the first token). Growing the prompt
should grow TTFT and barely the decode time (its steps reread a slightly longer KV cache); growing
the answer should grow the decode time, one step per token, and leave TTFT alone.
``course.verdicts.s14_slopes`` judges it.
"""

from __future__ import annotations

import statistics

from minieng.engine.llm_engine import LLMEngine
from minieng.config import SamplingParams
from minieng.measure.metrics import request_metrics
from minieng.measure.workloads import text_prompts

CASES = ("short", "long_prompt", "long_output")


def phase_cost_grid(
    engine: LLMEngine, prompt_tokens: tuple[int, int], output_tokens: tuple[int, int], repeats: int = 1
) -> dict[str, dict]:
    """Time the three requests (``CASES``), each alone, ``repeats`` times (medians reported).

    ``prompt_tokens``: (short, long) prompt lengths in tokens; ``output_tokens``: (short, long)
    answer lengths, each at least 2 (a decode time needs a second token). Returns, per case of
    ``CASES``: prompt_tokens, output_tokens, ttft_s, decode_s. Prompts are real text
    (``text_prompts``); answers run to their length (``ignore_eos``). Raises ``ValueError`` for
    lengths out of order or an answer under 2 tokens.
    """
    (short_p, long_p), (short_o, long_o) = prompt_tokens, output_tokens
    if not 0 < short_p < long_p or not 2 <= short_o < long_o:
        raise ValueError(
            f"phase_cost_grid: prompt_tokens={prompt_tokens} and output_tokens={output_tokens} must each be "
            "(short, long) with short < long, answers of 2 tokens or more"
        )
    shapes = {"short": (short_p, short_o), "long_prompt": (long_p, short_o), "long_output": (short_p, long_o)}
    grid = {}
    for case, (p, o) in shapes.items():
        prompts = text_prompts(engine.tokenizer, p, repeats)
        runs = [request_metrics(engine.generate([prompt], SamplingParams.fixed_length(o))[0]) for prompt in prompts]
        grid[case] = {
            "prompt_tokens": p,
            "output_tokens": o,
            "ttft_s": statistics.median(r.ttft_s for r in runs),
            "decode_s": statistics.median(r.e2el_s - r.ttft_s for r in runs),
        }
    return grid
