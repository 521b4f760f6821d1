"""The OpenAI API's request bodies and response objects, as far as minieng serves them.

Requests are pydantic models, so a field of the wrong type or out of range is refused before
anything reaches the engine; ``server.py`` turns every refusal into OpenAI's error body
(``error_body``) with status 400 (404 for an unknown model), never a 500.

Fields minieng cannot honour are refused, never silently ignored: each of ``NOT_HONOURED``
(``logit_bias``, penalties, ``suffix``, ``response_format``, tools, chat's ``echo``, vLLM's
``prompt_logprobs`` and sampling extensions) is accepted only with its neutral value, what its
absence means (``presence_penalty: 0``), and otherwise answers 400 naming it
(``_SamplingRequest.check_honoured``); so do ``best_of`` other than ``n``, ``n`` > 1 with greedy
sampling (as vLLM's ``SamplingParams._verify_greedy_sampling`` refuses it) and ``stream_options``
without ``stream``, as OpenAI's API and vLLM's do. Other unknown fields (``user``, ``metadata``,
...) change nothing about the answer and are ignored, as OpenAI-compatible servers do.

Log-probabilities (``logprobs.py`` builds the objects): a completion's ``logprobs: k`` and
``echo`` (the prompt's text first and, with ``logprobs``, its tokens with their log-probabilities;
``max_tokens: 0`` with ``echo`` scores the prompt without generating, what lm-eval's
loglikelihood requests ask), and chat's ``logprobs: true`` with ``top_logprobs: k``. k is capped by
the server's ``max_logprobs`` (the engine's ``EngineConfig.max_logprobs``), beyond which the
request is refused naming the cap (vLLM's rule; OpenAI's API caps completions at 5, chat at 20).

An explicit JSON ``null`` is the field's absence, its default: every optional field OpenAI's
reference marks nullable (``temperature``, ``top_p``, ``n``, ``stream``, ``stop``, ``seed``,
``max_tokens``, ``logprobs``, penalties, ``stream_options``, ...) and vLLM's ``Optional`` extensions
(``top_k``, ``min_p``, ``repetition_penalty``, ``stop_token_ids``), as both servers read it, so a
LangChain or LiteLLM body that sends every unset option as null is served (llama.cpp's server
refused such bodies: its issue #25515).

``n`` choices of each prompt, and a completion's ``prompt`` as a batch (a list of strings or of
token-id lists), are answered as vLLM answers them (``server.py``): one engine request per choice,
``index`` prompt-major (prompt p's choice i is ``p * n + i``).

Field names, defaults and object layouts follow OpenAI's API reference for ``/v1/completions``
and ``/v1/chat/completions`` (streaming chunks, ``stream_options.include_usage``, text content
parts, the ``developer`` role) and vLLM's extensions (``top_k``, ``ignore_eos``,
``stop_token_ids``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from minieng.config import GREEDY_TEMPERATURE, SamplingParams


class NotHonoured(ValueError):
    """A request field sent with a value minieng cannot honour; ``param`` names the field."""

    def __init__(self, param: str, message: str):
        super().__init__(f"{param}: {message}")
        self.param = param


def _absent(value: Any) -> bool:
    return value is None


def _off(value: Any) -> bool:
    return value is None or value is False


def _zero(value: Any) -> bool:
    return value is None or (type(value) in (int, float) and value == 0)


def _one(value: Any) -> bool:
    return value is None or (type(value) in (int, float) and value == 1)


def _empty(value: Any) -> bool:
    return value is None or value in ("", [], {})


def _no_tool(value: Any) -> bool:
    return value in (None, "none", "auto")  # "auto" with no tools given calls none


# Fields of OpenAI's API and vLLM's sampling extensions that minieng cannot honour: each is
# accepted only when its test says the value is neutral (what leaving it out means), otherwise
# refused with the reason and what to send instead.
NOT_HONOURED: dict[str, tuple[Callable[[Any], bool], str]] = {
    # Declared by completions (the prompt echoed); a chat request's echo is vLLM's (the last message repeated).
    "echo": (_off, "minieng does not echo a chat's last message (vLLM's chat echo): omit echo (or send false)"),
    "suffix": (_empty, "minieng does not complete text before a suffix: omit suffix"),
    "logit_bias": (_empty, "minieng does not bias logits: omit logit_bias"),
    "presence_penalty": (_zero, "minieng applies no penalties: omit presence_penalty (or send 0)"),
    "frequency_penalty": (_zero, "minieng applies no penalties: omit frequency_penalty (or send 0)"),
    "response_format": (
        lambda v: v is None or v == {"type": "text"},
        'minieng generates free text only: omit response_format (or send {"type": "text"})',
    ),
    "tools": (_empty, "minieng does not call tools: omit tools"),
    "tool_choice": (_no_tool, 'minieng does not call tools: omit tool_choice (or send "none")'),
    "functions": (_empty, "minieng does not call functions: omit functions"),
    "function_call": (_no_tool, 'minieng does not call functions: omit function_call (or send "none")'),
    # vLLM's extensions
    "repetition_penalty": (_one, "minieng applies no penalties: omit repetition_penalty (or send 1)"),
    "min_p": (_zero, "minieng samples with top_k and top_p only: omit min_p (or send 0)"),
    "min_tokens": (_zero, "minieng does not hold back EOS: omit min_tokens (or send 0)"),
    "prompt_logprobs": (
        _absent,
        "minieng returns a prompt's log-probabilities through /v1/completions with echo=true and logprobs "
        "(OpenAI's way), not vLLM's prompt_logprobs field: omit prompt_logprobs",
    ),
    "use_beam_search": (_off, "minieng does not search beams: omit use_beam_search (or send false)"),
    "include_stop_str_in_output": (
        _off,
        "minieng leaves stop strings out of the text: omit include_stop_str_in_output (or send false)",
    ),
}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    include_usage: bool | None = None  # null: false


class _SamplingRequest(BaseModel):
    """Fields shared by completions and chat completions. Fields not declared are kept in
    ``model_extra`` so that ``check_honoured`` can read them."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: str
    # Every optional field takes null as its absence (OpenAI's reference marks them nullable; vLLM
    # declares its extensions Optional): the defaults are applied in ``sampling_params``.
    max_tokens: int | None = Field(default=None, ge=1)
    # allow_inf_nan=False: JSON's Infinity (or 1e400) and NaN are refused here, naming the field.
    temperature: float | None = Field(default=None, ge=0.0, allow_inf_nan=False)  # null: 1
    top_p: float | None = Field(default=None, gt=0.0, le=1.0, allow_inf_nan=False)  # null: 1
    top_k: int | None = Field(default=None, ge=-1)  # vLLM: -1 or 0 (or null) keeps every token
    n: int | None = Field(default=None, ge=1)  # choices per prompt; null: 1
    best_of: int | None = Field(default=None, ge=1)  # candidates per prompt; only n is served
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None  # vLLM: token ids that end the output, beside EOS
    ignore_eos: bool | None = None  # null: false
    stream: bool | None = None  # null: false
    stream_options: StreamOptions | None = None

    @field_validator("stop")
    @classmethod
    def _stops_are_not_empty(cls, stop):
        stops = [stop] if isinstance(stop, str) else (stop or [])
        if any(not s for s in stops):
            raise ValueError("stop strings must be non-empty")
        return stop

    def check_honoured(self, max_logprobs: int | None = None) -> None:
        """Refuse what minieng would otherwise silently ignore, and log-probabilities beyond
        ``max_logprobs`` (the server's cap; None: no cap checked here).

        Raises:
            NotHonoured: a field of ``NOT_HONOURED`` sent with a value that asks for something
                (``logprobs: 5``, ``presence_penalty: 0.5``); ``stream_options`` without
                ``stream: true``; ``best_of`` other than ``n`` (OpenAI: best_of >= n; ranking more
                candidates than are returned needs their log-probabilities, which vLLM V1 refuses
                too: "does not yet support best_of"); ``n`` > 1 with greedy sampling (n identical
                choices), as vLLM's ``SamplingParams._verify_greedy_sampling`` refuses it; what
                ``_check_logprobs`` refuses.
        """
        if self.stream_options is not None and not self.stream:
            raise NotHonoured(
                "stream_options", "it applies to streamed responses only: send stream=true, or omit stream_options"
            )
        n = self.num_choices
        if self.best_of is not None and self.best_of < n:
            raise NotHonoured(
                "best_of", f"best_of={self.best_of} must be >= n={n} (OpenAI's rule): raise it, or omit it"
            )
        if self.best_of is not None and self.best_of > n:
            raise NotHonoured(
                "best_of",
                f"minieng does not rank {self.best_of} candidates to return the best n={n}: "
                "send best_of equal to n (or omit it) and ask for n choices",
            )
        if n > 1 and self.temperature is not None and self.temperature < GREEDY_TEMPERATURE:
            raise NotHonoured(
                "n",
                f"minieng refuses n={n} with greedy sampling (temperature {self.temperature}): the {n} "
                "choices would be identical (vLLM refuses it too); send n=1, or a temperature above 0",
            )
        for name, value in (self.model_extra or {}).items():
            if name in NOT_HONOURED and not NOT_HONOURED[name][0](value):
                raise NotHonoured(name, f"{NOT_HONOURED[name][1]}; got {repr(value)[:60]}")
        self._check_logprobs(max_logprobs)

    def _check_logprobs(self, max_logprobs: int | None) -> None:
        """Raises ``NotHonoured`` for log-probabilities the request cannot have (each kind says which)."""
        k, param = self.num_top_logprobs, self._top_logprobs_param
        if k is not None and max_logprobs is not None and k > max_logprobs:
            raise NotHonoured(
                param,
                f"{param}={k} asks for more log-probabilities per token than this server's cap, "
                f"max_logprobs={max_logprobs} (EngineConfig.max_logprobs, as vLLM's --max-logprobs): "
                f"ask for {max_logprobs} or fewer",
            )

    _top_logprobs_param: ClassVar[str] = "logprobs"  # the field that sets k

    @property
    def num_top_logprobs(self) -> int | None:
        """k, the most likely tokens returned beside each token's own log-probability; None when
        the request asks for no log-probabilities."""
        return None

    def _logprob_counts(self) -> tuple[int | None, int | None]:
        """The engine's ``SamplingParams.logprobs`` and ``prompt_logprobs``."""
        return self.num_top_logprobs, None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    @property
    def num_choices(self) -> int:
        """``n``: the choices asked of each prompt (1 when absent or null)."""
        return 1 if self.n is None else self.n

    def sampling_params(self, default_max_tokens: int) -> SamplingParams:
        """The engine's ``SamplingParams``; ``default_max_tokens`` when the request gives none, and
        each null field's default (temperature 1, top_p 1, every token kept, no stop), with the
        log-probabilities asked (``max_tokens: 0``: the prompt's, and no output token).
        Raises ``ValueError`` (naming the field) for what ``SamplingParams`` refuses."""
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        max_tokens = default_max_tokens if self.max_tokens is None else self.max_tokens
        logprobs, prompt_logprobs = self._logprob_counts()
        if max_tokens == 0 and prompt_logprobs is None:
            prompt_logprobs = 0  # the engine scores a prompt only when asked for its log-probabilities
        return SamplingParams(
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=max(self.top_k or 0, 0),
            seed=self.seed,
            max_tokens=max_tokens,
            stop=stop,
            stop_token_ids=list(self.stop_token_ids or []),
            ignore_eos=bool(self.ignore_eos),
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
        )


class CompletionRequest(_SamplingRequest):
    """``POST /v1/completions``: one prompt (text, or token ids) or a batch of them (a list of
    strings, or of token-id lists), as OpenAI's API takes them; each prompt is answered with ``n``
    choices. OpenAI's default ``max_tokens`` is 16.

    ``logprobs: k`` returns each token's log-probability and the k most likely at its position;
    ``echo: true`` returns the prompt before the completion (its tokens too, with ``logprobs``), and
    with ``max_tokens: 0`` the prompt alone, scored without generating (OpenAI's legacy API; vLLM
    runs one token and drops it). ``max_tokens: 0`` without ``echo`` is refused, as vLLM refuses it.
    """

    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(default=None, ge=0)  # 0: echo the prompt, scored, with no output token
    logprobs: int | None = Field(default=None, ge=0)
    echo: bool | None = None  # null: false

    @property
    def num_top_logprobs(self) -> int | None:
        return self.logprobs

    def _logprob_counts(self) -> tuple[int | None, int | None]:
        # As vLLM's CompletionRequest.to_sampling_params: an echoed prompt gets the same k.
        return self.logprobs, self.logprobs if self.echo else None

    def _check_logprobs(self, max_logprobs: int | None) -> None:
        if self.max_tokens == 0 and not self.echo:
            raise NotHonoured(
                "max_tokens",
                "max_tokens=0 generates nothing, which minieng answers only with echo=true (the prompt "
                "returned, scored with logprobs): send max_tokens >= 1, or echo=true",
            )
        super()._check_logprobs(max_logprobs)

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt_forms(cls, prompt):
        """Refuse, saying what is wrong, a list that is none of OpenAI's three list forms."""
        if not isinstance(prompt, list):
            return prompt  # a str passes; anything else fails the type check, naming prompt
        if not prompt:
            raise PydanticCustomError("batch", "an empty list holds no prompt: send a string, or a list of prompts")
        if all(isinstance(p, str) for p in prompt):
            return prompt  # a batch of texts
        if all(isinstance(p, list) for p in prompt):  # a batch of token-id lists
            for i, ids in enumerate(prompt):
                cls._check_ids(ids, f"prompt {i}: ")
            return prompt
        cls._check_ids(prompt, "")  # one prompt's token ids
        return prompt

    @staticmethod
    def _check_ids(ids: list, where: str) -> None:
        bad = next((i for i, p in enumerate(ids) if type(p) is not int), None)
        if bad is not None:
            raise PydanticCustomError(
                "token_ids",
                "{where}a list prompt holds token ids, which are integers (or a batch holds prompts, all "
                "strings or all token-id lists); got {value} at index {index}",
                {"where": where, "value": repr(ids[bad])[:40], "index": bad},
            )

    def prompts(self) -> list[str | list[int]]:
        """The batch's prompts, in order: one for a single prompt (text or token ids)."""
        if isinstance(self.prompt, str) or not self.prompt or isinstance(self.prompt[0], int):
            return [self.prompt]
        return list(self.prompt)


class ChatMessage(BaseModel):
    """One message of a conversation.

    ``content`` is a string or OpenAI's list of content parts; text parts
    (``{"type": "text", "text": ...}``) are joined with newlines, as vLLM joins them, and any
    other part (an image, audio, a file) is refused. ``developer`` (OpenAI's newer name for the
    system role) is read as ``system``, as vLLM and llama.cpp's server read it.
    """

    model_config = ConfigDict(extra="ignore", strict=True)
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[Any]

    @field_validator("role")
    @classmethod
    def _developer_is_system(cls, role: str) -> str:
        return "system" if role == "developer" else role

    @field_validator("content")
    @classmethod
    def _join_text_parts(cls, content: str | list[Any]) -> str:
        if isinstance(content, str):
            return content
        texts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict):
                what = f"a {type(part).__name__}"
            elif part.get("type") != "text":
                what = f"of type {part.get('type')!r}"[:60]
            elif not isinstance(part.get("text"), str):
                what = "a text part without a text string"
            else:
                texts.append(part["text"])
                continue
            raise PydanticCustomError(
                "content_part",
                "content part {index} is {what}: minieng reads text only; "
                'send a string or text parts ({"type": "text", "text": "..."})',
                {"index": i, "what": what},
            )
        return "\n".join(texts)


class ChatCompletionRequest(_SamplingRequest):
    """``POST /v1/chat/completions``: the conversation goes through the model's chat template.
    ``max_completion_tokens`` is OpenAI's newer name for ``max_tokens``; without either, the
    answer may run to the end of the context, as OpenAI's chat default."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = None  # null: false
    top_logprobs: int | None = Field(default=None, ge=0)  # with logprobs: true; null: 0

    _top_logprobs_param: ClassVar[str] = "top_logprobs"

    @property
    def num_top_logprobs(self) -> int | None:
        """``top_logprobs`` (0 when absent) with ``logprobs: true``, as vLLM's ``to_sampling_params``."""
        return (self.top_logprobs or 0) if self.logprobs else None

    def _check_logprobs(self, max_logprobs: int | None) -> None:
        if self.top_logprobs and not self.logprobs:
            raise NotHonoured(
                "top_logprobs",
                "top_logprobs needs logprobs=true (OpenAI's and vLLM's rule): send logprobs: true, or omit top_logprobs",
            )
        super()._check_logprobs(max_logprobs)

    def conversation(self) -> list[dict[str, str]]:
        """The messages as the chat template reads them: ``[{"role": ..., "content": text}, ...]``."""
        return [{"role": m.role, "content": m.content} for m in self.messages]


class TokenizeCompletionRequest(BaseModel):
    """``POST /tokenize`` with a prompt (vLLM's ``TokenizeCompletionRequest``): its token ids, the
    tokenizer's special tokens added unless ``add_special_tokens`` is false; ``return_token_strs``
    also returns each token's string (``convert_ids_to_tokens``). ``model``, when given, must be
    the served one."""

    model_config = ConfigDict(extra="ignore", strict=True)
    model: str | None = None
    prompt: str
    add_special_tokens: bool | None = None  # null: true
    return_token_strs: bool | None = None  # null: false


class TokenizeChatRequest(BaseModel):
    """``POST /tokenize`` with a conversation (vLLM's ``TokenizeChatRequest``): its token ids
    through the chat template, the generation prompt added, as ``/v1/chat/completions`` sends them
    to the engine. vLLM's options that change the template's output (``add_generation_prompt:
    false``, ``continue_final_message``, ``add_special_tokens: true``, ``chat_template``, tools)
    are refused: minieng tokenizes a conversation only the way it serves one."""

    model_config = ConfigDict(extra="allow", strict=True)
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    return_token_strs: bool | None = None

    def check_honoured(self) -> None:
        """Raises ``NotHonoured`` for an option that would tokenize otherwise than the chat endpoint."""
        neutral = {
            "add_generation_prompt": (None, True),
            "continue_final_message": (None, False),
            "add_special_tokens": (None, False),
            "chat_template": (None,),
            "chat_template_kwargs": (None, {}),
            "tools": (None, []),
        }
        for name, value in (self.model_extra or {}).items():
            if name in neutral and not any(value is v or (v is not None and value == v) for v in neutral[name]):
                raise NotHonoured(
                    name,
                    f"minieng tokenizes a conversation as its chat endpoint serves it (the generation prompt "
                    f"added, its own template): omit {name}; got {repr(value)[:60]}",
                )

    def conversation(self) -> list[dict[str, str]]:
        return [{"role": m.role, "content": m.content} for m in self.messages]


class DetokenizeRequest(BaseModel):
    """``POST /detokenize`` (vLLM's ``DetokenizeRequest``): ``tokens`` back to text, special tokens
    included (the tokenizer's ``decode``, as vLLM's)."""

    model_config = ConfigDict(extra="ignore", strict=True)
    model: str | None = None
    tokens: list[int]


def error_body(message: str, status: int, param: str | None = None, code: str | None = None) -> dict:
    """OpenAI's error object: ``{"error": {"message", "type", "param", "code"}}``. Every 4xx is an
    ``invalid_request_error``, as OpenAI's API types them (an unknown model too, with ``code``
    ``"model_not_found"``); 5xx a ``server_error``."""
    kind = "invalid_request_error" if 400 <= status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    """OpenAI's usage block; ``prompt_tokens_details.cached_tokens``: prompt tokens the prefix cache served."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def completion_chunk(
    request_id: str,
    model: str,
    created: int,
    text: str,
    finish_reason: str | None,
    include_usage: bool,
    index: int = 0,
    logprobs: dict | None = None,
) -> dict:
    """One streamed ``text_completion`` object, for choice ``index``, with its tokens' ``logprobs``
    (``logprobs.completion_logprobs``, or None). With ``include_usage``, every content chunk carries
    ``usage: null`` (the totals come in a last chunk of their own, ``usage_chunk``)."""
    chunk = {
        "id": request_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}],
    }
    if include_usage:
        chunk["usage"] = None
    return chunk


def chat_chunk(
    request_id: str,
    model: str,
    created: int,
    delta: dict,
    finish_reason: str | None,
    include_usage: bool,
    index: int = 0,
    logprobs: dict | None = None,
) -> dict:
    """One streamed ``chat.completion.chunk``, for choice ``index``; ``delta`` is
    ``{"role": "assistant", "content": ""}`` in each choice's first chunk and ``{"content": text}`` after it;
    ``logprobs``: its tokens' (``logprobs.chat_logprobs``), or None."""
    chunk = {
        "id": request_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}],
    }
    if include_usage:
        chunk["usage"] = None
    return chunk


def usage_chunk(request_id: str, model: str, created: int, chat: bool, totals: dict) -> dict:
    """The last chunk of a stream with ``include_usage``: empty ``choices`` and the totals."""
    return {
        "id": request_id,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": created,
        "model": model,
        "choices": [],
        "usage": totals,
    }


def completion_response(
    request_id: str, model: str, created: int, choices: list[tuple[str, str, dict | None]], totals: dict
) -> dict:
    """The ``text_completion`` object; ``choices``: ``(text, finish_reason, logprobs)`` in ``index``
    order (``logprobs``: ``logprobs.completion_logprobs``, or None)."""
    return {
        "id": request_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [
            {"index": i, "text": text, "logprobs": logprobs, "finish_reason": reason}
            for i, (text, reason, logprobs) in enumerate(choices)
        ],
        "usage": totals,
    }


def chat_response(
    request_id: str, model: str, created: int, choices: list[tuple[str, str, dict | None]], totals: dict
) -> dict:
    """The ``chat.completion`` object; ``choices``: ``(text, finish_reason, logprobs)`` in ``index``
    order (``logprobs``: ``logprobs.chat_logprobs``, or None)."""
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": i,
                "message": {"role": "assistant", "content": text},
                "logprobs": logprobs,
                "finish_reason": reason,
            }
            for i, (text, reason, logprobs) in enumerate(choices)
        ],
        "usage": totals,
    }


def model_card(model: str, max_model_len: int, created: int) -> dict:
    """OpenAI's model object (``GET /v1/models/{model}``), with vLLM's ``max_model_len``."""
    return {"id": model, "object": "model", "created": created, "owned_by": "minieng", "max_model_len": max_model_len}


def models_list(model: str, max_model_len: int, created: int | None = None) -> dict:
    """``GET /v1/models``: the one model this server runs."""
    return {"object": "list", "data": [model_card(model, max_model_len, created or int(time.time()))]}
