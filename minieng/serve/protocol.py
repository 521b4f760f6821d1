"""The OpenAI API's request bodies and response objects, as far as minieng serves them.

Requests are pydantic models, so a field of the wrong type or out of range is refused before
anything reaches the engine; ``server.py`` turns every refusal into OpenAI's error body
(``error_body``) with status 400 (404 for an unknown model), never a 500.

Fields minieng cannot honour are refused, never silently ignored: each of ``NOT_HONOURED``
(``logprobs``, ``echo``, ``n`` > 1, ``best_of`` > 1, ``logit_bias``, penalties, ``suffix``,
``response_format``, tools, and vLLM's sampling extensions) is accepted only with its neutral
value, what its absence means (``logprobs: null``, ``presence_penalty: 0``), and otherwise
answers 400 naming it (``_SamplingRequest.check_honoured``); so does ``stream_options`` without
``stream``, as OpenAI's API and vLLM's do. Other unknown fields (``user``, ``metadata``, ...) change
nothing about the answer and are ignored, as OpenAI-compatible servers do.

Field names, defaults and object layouts follow OpenAI's API reference for ``/v1/completions``
and ``/v1/chat/completions`` (streaming chunks, ``stream_options.include_usage``, text content
parts, the ``developer`` role) and vLLM's extensions (``top_k``, ``ignore_eos``,
``stop_token_ids``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from minieng.config import SamplingParams


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
    "n": (_one, "minieng returns one choice per request: send n=1 (or omit it) and repeat the request"),
    "best_of": (_one, "minieng samples one sequence per request: send best_of=1 (or omit it)"),
    "logprobs": (_off, "minieng does not return log-probabilities: omit logprobs (or send null/false)"),
    "top_logprobs": (_zero, "minieng does not return log-probabilities: omit top_logprobs"),
    "echo": (_off, "minieng does not echo the prompt: omit echo (or send false)"),
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
    "prompt_logprobs": (_absent, "minieng does not return log-probabilities: omit prompt_logprobs"),
    "use_beam_search": (_off, "minieng does not search beams: omit use_beam_search (or send false)"),
    "include_stop_str_in_output": (
        _off,
        "minieng leaves stop strings out of the text: omit include_stop_str_in_output (or send false)",
    ),
}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    include_usage: bool = False


class _SamplingRequest(BaseModel):
    """Fields shared by completions and chat completions. Fields not declared are kept in
    ``model_extra`` so that ``check_honoured`` can read them."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    # allow_inf_nan=False: JSON's Infinity (or 1e400) and NaN are refused here, naming the field.
    temperature: float = Field(default=1.0, ge=0.0, allow_inf_nan=False)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: int = Field(default=0, ge=-1)  # vLLM: -1 or 0 keeps every token
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None  # vLLM: token ids that end the output, beside EOS
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None

    @field_validator("stop")
    @classmethod
    def _stops_are_not_empty(cls, stop):
        stops = [stop] if isinstance(stop, str) else (stop or [])
        if any(not s for s in stops):
            raise ValueError("stop strings must be non-empty")
        return stop

    def check_honoured(self) -> None:
        """Refuse what minieng would otherwise silently ignore.

        Raises:
            NotHonoured: a field of ``NOT_HONOURED`` sent with a value that asks for something
                (``logprobs: 5``, ``presence_penalty: 0.5``), or ``stream_options`` without
                ``stream: true``.
        """
        if self.stream_options is not None and not self.stream:
            raise NotHonoured(
                "stream_options", "it applies to streamed responses only: send stream=true, or omit stream_options"
            )
        for name, value in (self.model_extra or {}).items():
            if name in NOT_HONOURED and not NOT_HONOURED[name][0](value):
                raise NotHonoured(name, f"{NOT_HONOURED[name][1]}; got {repr(value)[:60]}")

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    def sampling_params(self, default_max_tokens: int) -> SamplingParams:
        """The engine's ``SamplingParams``; ``default_max_tokens`` when the request gives none.
        Raises ``ValueError`` (naming the field) for what ``SamplingParams`` refuses."""
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return SamplingParams(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=max(self.top_k, 0),
            seed=self.seed,
            max_tokens=self.max_tokens or default_max_tokens,
            stop=stop,
            stop_token_ids=list(self.stop_token_ids or []),
            ignore_eos=self.ignore_eos,
        )


class CompletionRequest(_SamplingRequest):
    """``POST /v1/completions``: one prompt, as text or token ids. OpenAI's default ``max_tokens`` is 16.

    OpenAI's API also takes a batch of prompts (a list of strings, or of token-id lists) and
    answers a choice for each; minieng answers one choice per request, so it takes a batch of one
    (``["text"]``, ``[[1, 2]]``) as that prompt and refuses larger batches.
    """

    prompt: str | list[int]

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt(cls, prompt):
        if not isinstance(prompt, list):
            return prompt  # a str passes; anything else fails the type check, naming prompt
        if len(prompt) > 1 and all(isinstance(p, (str, list)) for p in prompt):
            raise PydanticCustomError(
                "batch",
                "a batch of several prompts is not supported (minieng answers one "
                "choice per request): send one request per prompt",
            )
        if len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # a batch of one prompt
            if isinstance(prompt, str):
                return prompt
        bad = next((i for i, p in enumerate(prompt) if type(p) is not int), None)
        if bad is not None:
            raise PydanticCustomError(
                "token_ids",
                "a list prompt holds token ids, which are integers; got {value} at index {index}",
                {"value": repr(prompt[bad])[:40], "index": bad},
            )
        return prompt


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

    def conversation(self) -> list[dict[str, str]]:
        """The messages as the chat template reads them: ``[{"role": ..., "content": text}, ...]``."""
        return [{"role": m.role, "content": m.content} for m in self.messages]


def error_body(message: str, status: int, param: str | None = None) -> dict:
    """OpenAI's error object: ``{"error": {"message", "type", "param", "code"}}``."""
    kind = {400: "invalid_request_error", 404: "not_found_error", 413: "invalid_request_error"}.get(
        status, "server_error"
    )
    code = {404: "model_not_found"}.get(status)
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
    request_id: str, model: str, created: int, text: str, finish_reason: str | None, include_usage: bool
) -> dict:
    """One streamed ``text_completion`` object. With ``include_usage``, every content chunk carries
    ``usage: null`` (the totals come in a last chunk of their own, ``usage_chunk``)."""
    chunk = {
        "id": request_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}],
    }
    if include_usage:
        chunk["usage"] = None
    return chunk


def chat_chunk(
    request_id: str, model: str, created: int, delta: dict, finish_reason: str | None, include_usage: bool
) -> dict:
    """One streamed ``chat.completion.chunk``; ``delta`` is ``{"role": "assistant", "content": ""}``
    in the first chunk and ``{"content": text}`` after it."""
    chunk = {
        "id": request_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
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


def completion_response(request_id: str, model: str, created: int, text: str, finish_reason: str, totals: dict) -> dict:
    return {
        "id": request_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}],
        "usage": totals,
    }


def chat_response(request_id: str, model: str, created: int, text: str, finish_reason: str, totals: dict) -> dict:
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finish_reason,
            }
        ],
        "usage": totals,
    }


def models_list(model: str, max_model_len: int, created: int | None = None) -> dict:
    """``GET /v1/models``: the one model this server runs."""
    return {
        "object": "list",
        "data": [
            {
                "id": model,
                "object": "model",
                "created": created or int(time.time()),
                "owned_by": "minieng",
                "max_model_len": max_model_len,
            }
        ],
    }
