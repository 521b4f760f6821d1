"""What happens to the tokens a step emits: appended, turned into text, checked for a stop.

vLLM's ``OutputProcessor`` and ``StopChecker`` in one small piece. ``RequestState`` is a request
as the engine keeps it between steps; ``append_tokens`` adds one step's tokens and says whether
and why the request stops; ``make_output`` is the ``RequestOutput`` a caller sees. Nothing here
touches the scheduler or the KV cache: finishing a stopped request is the engine's job.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from minieng.engine.detokenizer import IncrementalDetokenizer
from minieng.engine.outputs import Logprob, RequestOutput
from minieng.engine.sequence import Sequence, SequenceStatus


@dataclass
class RequestState:
    """A request between steps: its sequence and, with a tokenizer, its incremental detokenizer."""

    seq: Sequence
    detokenizer: IncrementalDetokenizer | None


def append_tokens(
    req: RequestState,
    token_ids: list[int],
    eos_token_ids: Collection[int],
    max_model_len: int,
    logprobs: list[dict[int, Logprob]] | None = None,
) -> tuple[list[int], str, SequenceStatus | None]:
    """Append a step's emitted tokens to ``req``'s sequence, token by token.

    A step can emit several tokens (accepted drafts): the first that stops the request (a stop
    token, EOS unless ``ignore_eos``, a stop string, ``max_tokens`` or ``max_model_len`` reached)
    is kept and the rest are dropped. ``logprobs``: one dict per token of ``token_ids`` (a request
    that asked for them), appended to ``seq.output_logprobs`` with the tokens kept and dropped
    with the rest. Returns the tokens kept, the text they add (flushed when the request stops)
    and the finishing status, or None while it runs on.
    """
    seq, params, detok = req.seq, req.seq.params, req.detokenizer
    kept: list[int] = []
    status = None
    delta = ""
    for i, tok in enumerate(token_ids):
        seq.output_token_ids.append(tok)
        if logprobs is not None and seq.output_logprobs is not None:
            seq.output_logprobs.append(logprobs[i])
        kept.append(tok)
        if detok is not None:
            delta += detok.add([tok])
        if tok in params.stop_token_ids or (not params.ignore_eos and tok in eos_token_ids):
            status = SequenceStatus.FINISHED_STOPPED
        elif detok is not None and detok.stopped:
            status = SequenceStatus.FINISHED_STOPPED  # a stop string
        elif len(seq.output_token_ids) >= params.max_tokens or seq.num_tokens >= max_model_len:
            status = SequenceStatus.FINISHED_LENGTH
        if status:
            break
    if status and detok is not None:
        delta += detok.finish()
    return kept, delta, status


def make_output(req: RequestState, new_token_ids: list[int] | None = None, delta: str = "") -> RequestOutput:
    """``req``'s state as a ``RequestOutput``; ``new_token_ids`` and ``delta`` are what the last step
    added (``new_logprobs``: the log-probabilities of ``new_token_ids``, the last ones of the
    sequence's, as vLLM's delta outputs carry them)."""
    seq = req.seq
    new_token_ids = list(new_token_ids or [])
    logprobs = new_logprobs = None
    if seq.output_logprobs is not None:
        logprobs = list(seq.output_logprobs)
        new_logprobs = logprobs[len(logprobs) - len(new_token_ids) :]
    return RequestOutput(
        request_id=seq.request_id,
        prompt_token_ids=seq.prompt_token_ids,
        token_ids=list(seq.output_token_ids),
        new_token_ids=new_token_ids,
        text=req.detokenizer.output_text if req.detokenizer else "",
        delta=delta,
        finished=seq.is_finished,
        finish_reason=seq.status.value if seq.is_finished else None,
        times=seq.times,
        num_cached_tokens=seq.num_cached_tokens,
        logprobs=logprobs,
        new_logprobs=new_logprobs,
        prompt_logprobs=_prompt_logprobs(seq),
    )


def _prompt_logprobs(seq) -> list | None:
    """The prompt's log-probabilities: a copy while the prompt still computes; once whole, the list
    itself, which nothing changes again (a long echoed prompt is not copied at every decode step)."""
    if seq.prompt_logprobs is None:
        return None
    return seq.prompt_logprobs if seq.prompt_logprobs_from is None else list(seq.prompt_logprobs)
