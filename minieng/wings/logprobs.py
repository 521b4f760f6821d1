"""Log-probabilities of tokens, as a request asks for them (``SamplingParams.logprobs`` and
``prompt_logprobs``, vLLM's names).

What they are: log_softmax of the model's raw float32 logits at a position, before temperature,
top-k and top-p, vLLM's default (``logprobs_mode="raw_logprobs"``, ``vllm/v1/sample/sampler.py``).
So they are the model's own distribution, the same whether the request samples greedily or at
temperature 1.3; the probability a sampled token was actually drawn with is not reported.

For one position the engine returns a dict ``{token id: Logprob}`` (vLLM's ``SampleLogprobs``
entries): first the token itself (the generated one, or for a prompt the prompt's next token),
with its rank, then the k most likely tokens, ranks 1..k, most likely first. The token is there
even when it is outside the top k; when it is inside, it appears once (so a dict holds k or
k + 1 entries). Its rank is the number of tokens whose log-probability is >= its own, as vLLM's
``batched_count_greater_than`` counts it (1 = the most likely).

They are a hook on the logits the model runner is about to sample (``LogprobsHook``, set as
``ModelRunner.logprobs``): it reads the rows asked for (``gather_logprobs``: plain lists, one
device-to-host copy per tensor) and makes them dicts with each token's text (``make_logprob_dicts``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

from minieng.core.model_runner import ModelRunnerOutput, StepLayout
from minieng.core.outputs import Logprob, SampleLogprobs
from minieng.core.scheduler import PROMPT_ROWS_PER_STEP


class RowLogprobs(NamedTuple):
    """One position's log-probabilities as plain data: ``token_ids[0]`` is the token asked about
    and ``rank`` its rank; ``token_ids[1:]`` the top k, most likely first; ``logprobs`` alike."""

    token_ids: list[int]
    logprobs: list[float]
    rank: int


# Rows a log_softmax takes at once (``gather_logprobs``): 256 rows of a 128k vocabulary in float32
# are 128 MiB a copy; as many as the scheduler lets one step score (``PROMPT_ROWS_PER_STEP``).
ROWS_AT_ONCE = PROMPT_ROWS_PER_STEP


def max_logits_rows(max_num_seqs: int, num_speculative_tokens: int = 0) -> int:
    """The most rows of logits a step computes: each of ``max_num_seqs`` sequences samples at most
    ``1 + num_speculative_tokens`` rows (a decode verifying its drafts), and the prompts owing
    log-probabilities take ``PROMPT_ROWS_PER_STEP`` more at most (chunked prefill; without chunking
    a prompt is never cut, and its rows are its length). ``memory_plan`` profiles that many."""
    return max_num_seqs * (1 + num_speculative_tokens) + PROMPT_ROWS_PER_STEP


def gather_logprobs(logits: torch.Tensor, token_ids: Sequence[int], num_top: Sequence[int]) -> list[RowLogprobs]:
    """Log-probabilities of ``token_ids`` and of the top tokens, row by row.

    Args:
        logits: [n, vocab] raw logits (computed in float32 whatever their dtype).
        token_ids: n ids, the token each row asks about (sampled, or the prompt's next).
        num_top: n counts k >= 0 of top tokens to return per row (more than the vocabulary: all).
    Returns:
        n ``RowLogprobs``, each of 1 + k entries.
    As vLLM's ``Sampler.gather_logprobs`` (``vllm/v1/sample/sampler.py``): log_softmax, the
    token's value and rank, then ``torch.topk``. One log_softmax over ``ROWS_AT_ONCE`` rows at a
    time: a prompt's rows (a whole chunk, with a large vocabulary) would otherwise take several
    [n, vocab] float32 copies beside the logits, memory the KV sizing never profiled.
    """
    n = logits.shape[0]
    assert len(token_ids) == n and len(num_top) == n, "one token id and one k per row"
    if n > ROWS_AT_ONCE:
        return [
            row
            for start in range(0, n, ROWS_AT_ONCE)
            for row in gather_logprobs(
                logits[start : start + ROWS_AT_ONCE],
                token_ids[start : start + ROWS_AT_ONCE],
                num_top[start : start + ROWS_AT_ONCE],
            )
        ]
    if n == 0:
        return []
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    ids = torch.tensor(list(token_ids), dtype=torch.long, device=logits.device).unsqueeze(1)
    token_logprobs = logprobs.gather(1, ids)  # [n, 1]
    ranks = (logprobs >= token_logprobs).sum(dim=-1)
    k = min(max(num_top), logprobs.shape[-1])
    if k > 0:
        top_values, top_ids = torch.topk(logprobs, k, dim=-1)
        ids, token_logprobs = torch.cat([ids, top_ids], dim=1), torch.cat([token_logprobs, top_values], dim=1)
    rows_ids, rows_values, rows_ranks = ids.tolist(), token_logprobs.tolist(), ranks.tolist()
    return [
        RowLogprobs(i[: 1 + top], v[: 1 + top], r) for i, v, r, top in zip(rows_ids, rows_values, rows_ranks, num_top)
    ]


class TokenTexts:
    """Each token id's text, ``tokenizer.decode([id])``, decoded once and remembered (at most one
    entry per vocabulary id). Without a tokenizer every text is None."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._texts: dict[int, str] = {}

    def __call__(self, token_id: int) -> str | None:
        if self.tokenizer is None:
            return None
        text = self._texts.get(token_id)
        if text is None:
            text = self._texts[token_id] = self.tokenizer.decode([token_id])
        return text


def make_logprob_dict(row: RowLogprobs, decode: Callable[[int], str | None]) -> dict[int, Logprob]:
    """``{token id: Logprob}`` of one position: the token asked about first (with its rank), then
    the top k by rank (1..k); a top token equal to the first is not repeated."""
    first, *top = zip(row.token_ids, row.logprobs)
    out = {first[0]: Logprob(first[1], row.rank, decode(first[0]))}
    for rank, (token_id, value) in enumerate(top, start=1):
        if token_id not in out:
            out[token_id] = Logprob(value, rank, decode(token_id))
    return out


def make_logprob_dicts(rows: Sequence[RowLogprobs], decode: Callable[[int], str | None]) -> SampleLogprobs:
    """``make_logprob_dict`` of every row, in order."""
    return [make_logprob_dict(row, decode) for row in rows]


class LogprobsHook:
    """``ModelRunner.logprobs``: fills a step's ``ModelRunnerOutput.logprobs`` and ``prompt_logprobs``
    from its logits, for the requests that asked, each token's text read through ``tokenizer``."""

    def __init__(self, tokenizer):
        self.token_texts = TokenTexts(tokenizer)

    def __call__(
        self, logits: torch.Tensor, lay: StepLayout, tokens: dict[str, list[int]], result: ModelRunnerOutput
    ) -> None:
        """``logits`` [sampling rows, then prompt rows, vocab], in one ``gather_logprobs`` over the
        rows asked for. An emitted token's is read at the row that predicted it: with drafts,
        accepted draft i's at row i and the last token's at the row after the last accepted draft."""
        rows, targets, tops, owners = [], [], [], []
        row = 0
        for seq, num_rows in lay.sampling:
            k = seq.params.logprobs
            if k is not None:
                emitted = tokens[seq.request_id]
                rows.extend(range(row, row + len(emitted)))
                targets.extend(emitted)
                tops.extend([k] * len(emitted))
                owners.append((seq, len(emitted), None))
            row += num_rows
        for seq, first, count in lay.prompt_rows:
            rows.extend(range(row, row + count))
            targets.extend(seq.prompt_token_ids[first + 1 : first + 1 + count])
            tops.extend([seq.params.prompt_logprobs] * count)
            owners.append((seq, count, first + 1))
            row += count
        if not rows:
            return
        index = torch.tensor(rows, dtype=torch.long, device=logits.device)
        dicts = make_logprob_dicts(gather_logprobs(logits[index], targets, tops), self.token_texts)
        at = 0
        for seq, count, first_prompt_token in owners:
            if first_prompt_token is None:
                result.logprobs[seq.request_id] = dicts[at : at + count]
            else:
                result.prompt_logprobs[seq.request_id] = (first_prompt_token, dicts[at : at + count])
            at += count
