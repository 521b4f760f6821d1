"""Text in and out: a step's tokens turned into text and checked for a stop (vLLM's
``OutputProcessor`` and ``StopChecker``), and what the engine hands out: a request's state after a
step, and the record of each step, plain data the instruments (``measure``) read.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from minieng.core.sequence import RequestTimes, Sequence, SequenceStatus

Prompt = str | list[int]  # text, tokenized as is, or token ids
EMPTY_PROMPT = "prompt is empty (0 tokens): give at least one token"
REPLACEMENT = "\ufffd"


def check_text(text: str, what: str) -> None:
    """Raise ``ValueError`` if ``text`` is not valid Unicode: a lone surrogate (U+D800..U+DFFF,
    which JSON's ``"\\ud800"`` escape can carry) has no UTF-8 encoding, and tokenizers fail on it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(
            f"{what} holds a lone surrogate (U+{ord(text[e.start]):04X} at character {e.start}), "
            "which is not valid Unicode text: send the character's surrogate pair, or remove it"
        ) from None


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

    Log-probabilities (``wings/logprobs.py``), None unless the request asked: ``logprobs``, one
    ``{token id: Logprob}`` per token of ``token_ids`` (vLLM's ``CompletionOutput.logprobs``), and
    ``new_logprobs`` those of ``new_token_ids``; ``prompt_logprobs``, one per prompt token, the
    first None (vLLM's ``RequestOutput.prompt_logprobs``), whole from the first output on.
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
    """The composition and duration of one step (synchronized on CUDA), built by ``EngineCore.step``.

    ``chunks``: per scheduled sequence (decodes first), ``(new tokens, tokens already in the KV
    cache, rows the LM head ran on)``: 0 rows mid-prompt, 1, k + 1 with k speculative tokens, plus
    one per prompt position scored for ``prompt_logprobs``. A step's FLOPs and bytes follow from it
    (``measure.flops_bytes.step_work``).
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
    draft_s: float = 0.0  # of duration_s, speculative decoding's proposing
    forward_s: float = 0.0  # of duration_s, the model's forward pass alone
    comm_s: float = 0.0  # of forward_s, this process's time in collectives between devices
    forward_path: str = "eager"  # how the forward ran: "eager", or a fast path's name (``forward_paths``)
    # Per request admitted for the first time (not a preempted one's readmission), but those asking
    # prompt_logprobs, which read no cache (as vLLM): (prompt tokens looked up, tokens the prefix
    # cache served), vLLM's PrefixCacheStats queries and hits.
    prefix_cache_lookups: list[tuple[int, int]] = field(default_factory=list)


class IncrementalDetokenizer:
    """Incremental detokenization for streaming, and stop strings.

    A byte-level BPE token can hold half of a UTF-8 character: decoding it alone gives U+FFFD. So
    a short window of recent tokens is decoded and text released only once the window no longer
    ends in a replacement character (the prefix/read offsets of Hugging Face's ``TextStreamer`` and
    vLLM). Text that could still begin a stop string is held back, so a stop string never leaks.
    The deltas concatenated equal ``output_text``, the decode of all output ids unless a stop cut it.
    """

    def __init__(self, tokenizer, stop: list[str] | None = None, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.stop = list(stop or [])
        self.skip_special_tokens = skip_special_tokens
        self.token_ids: list[int] = []
        self.text = ""  # decoded so far (may extend past a stop string before truncation)
        self.output_text = ""  # final text, cut at a stop string
        self.num_released = 0  # characters of text already handed out as deltas
        self.prefix_offset = 0
        self.read_offset = 0
        self.stopped = False

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add(self, new_token_ids: list[int]) -> str:
        """Feed new output ids; return the text delta now safe to show (maybe "")."""
        self.token_ids.extend(new_token_ids)
        prefix = self._decode(self.token_ids[self.prefix_offset : self.read_offset])
        window = self._decode(self.token_ids[self.prefix_offset :])
        if len(window) > len(prefix) and not window.endswith(REPLACEMENT):
            self.text += window[len(prefix) :]
            self.prefix_offset, self.read_offset = self.read_offset, len(self.token_ids)
        return self._release(final=False)

    def _release(self, final: bool) -> str:
        end = len(self.text)
        for s in self.stop:
            hit = self.text.find(s)
            if hit != -1 and hit < end:
                end, self.stopped = hit, True
        if not self.stopped and not final:
            end -= self._held_back()
        self.output_text = self.text[:end] if (self.stopped or final) else self.text
        if end <= self.num_released:
            return ""
        delta = self.text[self.num_released : end]
        self.num_released = end
        return delta

    def _held_back(self) -> int:
        """Characters at the end of the text that could be the beginning of a stop string."""
        longest = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(self.text)), longest, -1):
                if self.text.endswith(s[:k]):
                    longest = k
                    break
        return longest

    def finish(self) -> str:
        """Flush what is left when the request ends (a trailing partial character included)."""
        if not self.stopped:
            full = self._decode(self.token_ids)
            if full.startswith(self.text):
                self.text = full
        return self._release(final=True)


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
    """Append a step's emitted tokens to ``req``'s sequence, token by token, with their
    ``logprobs`` dicts if asked. A step can emit several (speculative decoding): the first that
    stops the request (a stop token, EOS unless ``ignore_eos``, a stop string, ``max_tokens`` or
    ``max_model_len``) is kept and the rest dropped. Returns the tokens kept, the text they add
    (flushed when the request stops) and the finishing status, or None while it runs on."""
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
