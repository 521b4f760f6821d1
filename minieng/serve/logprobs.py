"""OpenAI's log-probability objects, and the echoed prompt, built from the engine's outputs.

The engine gives one ``{token id: Logprob}`` dict per token (``wings/logprobs.py``: the token itself
first, with its rank, then the k most likely; the raw float32 logits' log_softmax, before
temperature, top-k and top-p); a prompt's first token has None (nothing predicts it). This module
turns them into the API's objects:

- completions (``logprobs: k``): ``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}``,
  built as vLLM's ``_create_completion_logprobs`` (``vllm/entrypoints/openai/serving_completion.py``)
  builds it: each token's own text (``decode`` of its id alone), its log-probability (null for a
  prompt's first token), ``top_logprobs`` the first k + 1 entries of its dict keyed by their text
  (the token itself and the k most likely: OpenAI's "up to logprobs + 1 elements"; entries whose
  texts coincide keep one key), and ``text_offset`` the character offset of each token, each the
  previous one plus the previous token's text length. The offsets match the returned text wherever
  the tokens' texts make it up; a character split over two tokens (each decoding to U+FFFD) shifts
  them, as in vLLM.
- chat (``logprobs: true, top_logprobs: k``): ``{"content": [{"token", "logprob", "bytes",
  "top_logprobs": [{"token", "logprob", "bytes"}, ...]}, ...], "refusal": null}`` as OpenAI's
  reference lays it out and vLLM's ``_create_chat_logprobs`` (``serving_chat.py``) fills it;
  ``bytes`` is the UTF-8 of the token's text (vLLM's ``encode("utf-8", errors="replace")``: a
  token holding part of a character gives U+FFFD's bytes). ``top_logprobs`` lists the k most likely
  tokens, most likely first, as OpenAI's reference defines it (vLLM takes the dict's first k entries,
  which puts the sampled token first even when it is not among the k most likely).

Every log-probability is clamped at ``LOGPROB_FLOOR`` (-9999.0), as vLLM and OpenAI write a
probability of zero (``-inf`` is not JSON).

``ChoiceLogprobs`` follows one choice as its outputs arrive: the echoed prompt first (its text,
and its tokens with their log-probabilities), then each step's tokens. A stream hands out what
has gathered with each chunk that carries text, a whole response all of it at the end, so the
streamed log-probabilities, concatenated, equal the whole response's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from minieng.core.outputs import Logprob, RequestOutput

# What vLLM writes for a log-probability of -inf (serving_completion.py, serving_chat.py), as OpenAI does.
LOGPROB_FLOOR = -9999.0


def _clamped(value: float) -> float:
    return max(value, LOGPROB_FLOOR)


def _token_text(entry: dict[int, Logprob] | None, token_id: int, decode: Callable[[int], str]) -> str:
    """A token's own text: the engine's ``decoded_token``, else ``decode(token_id)`` (vLLM's
    ``_get_decoded_token``)."""
    logprob = None if entry is None else entry.get(token_id)
    if logprob is not None and logprob.decoded_token is not None:
        return logprob.decoded_token
    return decode(token_id)


def completion_logprobs(
    token_ids: Sequence[int],
    entries: Sequence[dict[int, Logprob] | None],
    num_top: int,
    decode: Callable[[int], str],
    text_offset: int = 0,
) -> dict:
    """OpenAI's ``choices[].logprobs`` of a completion, for ``token_ids`` (as vLLM's
    ``_create_completion_logprobs``).

    Args:
        token_ids: the tokens, in order (an echoed prompt's first).
        entries: one engine dict per token (``RequestOutput.logprobs`` / ``prompt_logprobs``), or
            None where nothing predicts the token (a prompt's first): its log-probability is null.
        num_top: the request's ``logprobs`` k; ``top_logprobs`` holds the first k + 1 entries.
        decode: a token id's text, for a token its dict lacks.
        text_offset: the character offset of the first token (a stream's chunk continues the last).
    Returns:
        ``{"tokens": [str], "token_logprobs": [float | None], "top_logprobs": [{str: float} | None],
        "text_offset": [int]}``, one item per token.
    """
    tokens, token_logprobs, top_logprobs, offsets = [], [], [], []
    for token_id, entry in zip(token_ids, entries, strict=True):
        text = _token_text(entry, token_id, decode)
        own = None if entry is None else entry.get(token_id)
        tokens.append(text)
        token_logprobs.append(None if own is None else _clamped(own.logprob))
        if own is None:
            top_logprobs.append(None)
        else:
            first = list(entry.items())[: num_top + 1]
            top_logprobs.append({_token_text(entry, i, decode): _clamped(lp.logprob) for i, lp in first})
        offsets.append(text_offset)
        text_offset += len(text)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs, "text_offset": offsets}


def _chat_item(text: str, logprob: float | None) -> dict:
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8", errors="replace"))}


def _most_likely(entry: dict[int, Logprob] | None, k: int) -> list[tuple[int, Logprob]]:
    """The k most likely tokens of an engine dict, most likely first: its entries but the first
    (the token asked about) when that one ranks below k."""
    items = list((entry or {}).items())
    if items and items[0][1].rank > k:
        items = items[1:]
    return sorted(items, key=lambda item: -item[1].logprob)[:k]


def chat_logprobs(
    token_ids: Sequence[int], entries: Sequence[dict[int, Logprob] | None], num_top: int, decode: Callable[[int], str]
) -> dict:
    """OpenAI's ``choices[].logprobs`` of a chat completion: ``{"content": [...], "refusal": None}``,
    one item per token of ``token_ids`` (``entries``, ``decode``: as ``completion_logprobs``), each
    ``{"token", "logprob", "bytes", "top_logprobs"}`` with the ``num_top`` most likely tokens."""
    content = []
    for token_id, entry in zip(token_ids, entries, strict=True):
        text = _token_text(entry, token_id, decode)
        own = None if entry is None else entry.get(token_id)
        item = _chat_item(text, None if own is None else _clamped(own.logprob))
        item["top_logprobs"] = [
            _chat_item(_token_text(entry, i, decode), _clamped(lp.logprob)) for i, lp in _most_likely(entry, num_top)
        ]
        content.append(item)
    return {"content": content, "refusal": None}


class ChoiceLogprobs:
    """One choice's text and log-probabilities as its outputs arrive, a stream's and a whole
    response's alike.

    Args:
        num_top: k of the request (completions' ``logprobs``, chat's ``top_logprobs``, 0 when
            absent with ``logprobs: true``), or None: no log-probabilities asked.
        decode: a token id's text.
        chat: chat's object (``chat_logprobs``) rather than a completion's.
        echo: the prompt's text to return first (completions' ``echo``), or None; with ``num_top``
            its tokens come first too, with their log-probabilities (``prompt_logprobs``).
    """

    def __init__(self, num_top: int | None, decode: Callable[[int], str], chat: bool, echo: str | None = None):
        self.num_top, self.decode, self.chat, self.echo = num_top, decode, chat, echo
        self._ids: list[int] = []
        self._entries: list[dict[int, Logprob] | None] = []
        self._text_offset = 0

    def add(self, out: RequestOutput) -> str:
        """Take one output of the choice's request: returns the text it adds (the echoed prompt
        before the first output's); its tokens' log-probabilities wait for ``take``."""
        text = out.delta
        if self.echo is not None:
            text, self.echo = self.echo + text, None
            if self.num_top is not None:
                self._ids += out.prompt_token_ids
                self._entries += out.prompt_logprobs or [None] * len(out.prompt_token_ids)
        if self.num_top is not None:
            self._ids += out.new_token_ids
            self._entries += out.new_logprobs or [None] * len(out.new_token_ids)
        return text

    def take(self) -> dict | None:
        """The API's logprobs object of the tokens added since the last ``take`` (None when none
        was asked); a completion's ``text_offset`` goes on from the last token taken."""
        if self.num_top is None:
            return None
        ids, entries, self._ids, self._entries = self._ids, self._entries, [], []
        if self.chat:
            return chat_logprobs(ids, entries, self.num_top, self.decode)
        got = completion_logprobs(ids, entries, self.num_top, self.decode, self._text_offset)
        if ids:
            self._text_offset = got["text_offset"][-1] + len(got["tokens"][-1])
        return got
