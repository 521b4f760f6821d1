"""The OpenAI API's request bodies and response objects, as far as minieng serves them.

Requests are pydantic models, so a field of the wrong type or out of range is refused before
anything reaches the engine; ``server.py`` turns every refusal into OpenAI's error body
(``error_body``) with status 400 (404 for an unknown model), never a 500. Unknown fields are
ignored, as OpenAI-compatible servers do (clients send ``user``, ``logprobs: null``, ...), except
values minieng cannot honour (``n`` > 1, ``best_of``), which are refused with the reason.

Field names, defaults and object layouts follow OpenAI's API reference for ``/v1/completions``
and ``/v1/chat/completions`` (streaming chunks, ``stream_options.include_usage``) and vLLM's
extensions (``top_k``, ``ignore_eos``).
"""

from __future__ import annotations

import time
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .config import SamplingParams


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    include_usage: bool = False


class _SamplingRequest(BaseModel):
    """Fields shared by completions and chat completions."""

    model_config = ConfigDict(extra="ignore", strict=True)

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=-1)  # vLLM: -1 or 0 keeps every token
    seed: int | None = None
    stop: str | list[str] | None = None
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1, le=1)  # one choice per request: minieng does not fan out

    @field_validator("stop")
    @classmethod
    def _stops_are_not_empty(cls, stop):
        stops = [stop] if isinstance(stop, str) else (stop or [])
        if any(not s for s in stops):
            raise ValueError("stop strings must be non-empty")
        return stop

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    def sampling_params(self, default_max_tokens: int) -> SamplingParams:
        """The engine's ``SamplingParams``; ``default_max_tokens`` when the request gives none."""
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=max(self.top_k, 0),
                              seed=self.seed, max_tokens=self.max_tokens or default_max_tokens, stop=stop,
                              ignore_eos=self.ignore_eos)


class CompletionRequest(_SamplingRequest):
    """``POST /v1/completions``: one prompt, as text or token ids. OpenAI's default ``max_tokens`` is 16."""

    prompt: str | list[int]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    role: Literal["system", "user", "assistant"]
    content: str


class ChatCompletionRequest(_SamplingRequest):
    """``POST /v1/chat/completions``: the conversation goes through the model's chat template.
    ``max_completion_tokens`` is OpenAI's newer name for ``max_tokens``; without either, the
    answer may run to the end of the context, as OpenAI's chat default."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)


def error_body(message: str, status: int, param: str | None = None) -> dict:
    """OpenAI's error object: ``{"error": {"message", "type", "param", "code"}}``."""
    kind = {400: "invalid_request_error", 404: "not_found_error"}.get(status, "server_error")
    code = {404: "model_not_found"}.get(status)
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    """OpenAI's usage block; ``prompt_tokens_details.cached_tokens``: prompt tokens the prefix cache served."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def completion_chunk(request_id: str, model: str, created: int, text: str, finish_reason: str | None,
                     include_usage: bool) -> dict:
    """One streamed ``text_completion`` object. With ``include_usage``, every content chunk carries
    ``usage: null`` (the totals come in a last chunk of their own, ``usage_chunk``)."""
    chunk = {"id": request_id, "object": "text_completion", "created": created, "model": model,
             "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}]}
    if include_usage:
        chunk["usage"] = None
    return chunk


def chat_chunk(request_id: str, model: str, created: int, delta: dict, finish_reason: str | None,
               include_usage: bool) -> dict:
    """One streamed ``chat.completion.chunk``; ``delta`` is ``{"role": "assistant", "content": ""}``
    in the first chunk and ``{"content": text}`` after it."""
    chunk = {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": model,
             "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]}
    if include_usage:
        chunk["usage"] = None
    return chunk


def usage_chunk(request_id: str, model: str, created: int, chat: bool, totals: dict) -> dict:
    """The last chunk of a stream with ``include_usage``: empty ``choices`` and the totals."""
    return {"id": request_id, "object": "chat.completion.chunk" if chat else "text_completion",
            "created": created, "model": model, "choices": [], "usage": totals}


def completion_response(request_id: str, model: str, created: int, text: str, finish_reason: str,
                        totals: dict) -> dict:
    return {"id": request_id, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}],
            "usage": totals}


def chat_response(request_id: str, model: str, created: int, text: str, finish_reason: str, totals: dict) -> dict:
    return {"id": request_id, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                         "finish_reason": finish_reason}],
            "usage": totals}


def models_list(model: str, max_model_len: int, created: int | None = None) -> dict:
    """``GET /v1/models``: the one model this server runs."""
    return {"object": "list", "data": [{"id": model, "object": "model", "created": created or int(time.time()),
                                        "owned_by": "minieng", "max_model_len": max_model_len}]}
