"""The model a lesson measures on the reader's device, and the model its text comes from.

``course_model(MODEL)`` is what every notebook's parameters cell feeds its engine:

- ``MODEL = None`` (the default) takes ``$MINIENG_MODEL`` when set, else the right model for the
  device: on a CPU the embedded SmolLM2-135M-Instruct, real weights; on a GPU the published shape
  ``measure.model_choice.choose_model`` picks from the device's measured bandwidth, its free
  memory and a decode step's fixed cost per layer, timed here on the embedded model (whose
  step on a GPU is almost all fixed cost).
- A ``config.PUBLISHED_SHAPES`` name: that shape. Its real checkpoint when the reader allowed
  downloads (``HF_HUB_OFFLINE=0``) and the Hub gives it; otherwise random weights of its exact
  shape (``load_format="dummy"``, no network), with the embedded tokenizer for prompts. The
  timings of random weights are real; their text is noise.
- Anything else: a local directory, a ``.gguf`` file or a Hub id, loaded as ``LLMEngine(model=...)``.

Where a lesson needs real text (a streamed reply, accuracy, draft acceptance),
``CourseModel.text_engine`` gives an engine with real weights: the lesson's own when its weights
are real, else the embedded default.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, field

import torch

from minieng.config import DEFAULT_MODEL_NAME, PUBLISHED_CHECKPOINTS, PUBLISHED_SHAPES
from minieng.engine.llm_engine import LLMEngine
from minieng.lab.probes import minieng_decode, warm_up
from minieng.measure.model_choice import ModelChoice, choose_model, fixed_cost_per_layer_s
from minieng.measure.peaks import device_free_bytes
from minieng.measure.workloads import text_prompts
from minieng.model.loader import resolve_model_dir

MODEL_ENV = "MINIENG_MODEL"  # names the course's model when a notebook's MODEL is None (CI, a workshop)
PROBE_KV_GIB = 0.25  # the probe engine's KV pool: one short sequence
PROBE_MAX_MODEL_LEN = 1024


@dataclass
class CourseModel:
    """The model a lesson measures.

    Attributes:
        name: what the reader sees (a shape's name, a path or a Hub id).
        engine_args: ``LLMEngine(**engine_args, ...)`` loads it (``model``, ``load_format``).
        real_weights: False for random weights (timings real, text noise).
        why: why this model, in a sentence.
        choice: the prediction that chose it on a GPU (None where nothing was predicted).
        probe_engine: the embedded model's engine, real weights: the one the GPU choice timed, or the one
            ``text_engine`` built.
    """

    name: str
    engine_args: dict
    real_weights: bool
    why: str
    choice: ModelChoice | None = None
    probe_engine: LLMEngine | None = field(default=None, repr=False)

    def lines(self) -> list[str]:
        """What a notebook prints: the model, its weights, and why."""
        weights = "real weights" if self.real_weights else "random weights: the timings are real, the text is noise"
        return [f"model: {self.name} ({weights})", f"why: {self.why}"]

    @property
    def bytes_dominate(self) -> bool | None:
        """Whether the choice predicted a decode step mostly spent reading bytes (None: not predicted)."""
        return self.choice.bytes_dominate if self.choice else None

    def text_engine(self, engine: LLMEngine, **overrides) -> LLMEngine:
        """An engine whose text means something: ``engine`` itself when its weights are real, else
        the embedded default with real weights (the GPU probe's engine, or one built now with
        ``overrides``, e.g. its KV budget)."""
        if self.real_weights:
            return engine
        if self.probe_engine is None:
            self.probe_engine = LLMEngine(**overrides)
        return self.probe_engine


def downloads_allowed() -> bool:
    """Whether the reader allowed Hub downloads: ``HF_HUB_OFFLINE=0`` set explicitly."""
    return os.environ.get("HF_HUB_OFFLINE") == "0"


def course_model(model: str | None = None, bandwidth_gbps: float | None = None, device: str = "auto") -> CourseModel:
    """The model for a lesson; see the module's docstring.

    Args:
        model: None (the device's choice, or ``$MINIENG_MODEL``), a published shape's name, a local
            directory, a ``.gguf`` file or a Hub id.
        bandwidth_gbps: the device's measured bandwidth (``machine_ceilings().peak``); a GPU's
            choice needs it.
        device: where the engines will run (``"auto"``: CUDA when available).
    Raises:
        ValueError: a GPU choice without ``bandwidth_gbps``, or no shape that fits the device.
    """
    if model is not None:
        return _named(model, "named by the notebook's MODEL")
    if os.environ.get(MODEL_ENV):
        return _named(os.environ[MODEL_ENV], f"named by ${MODEL_ENV}")
    if not _is_cuda(device):
        return CourseModel(
            DEFAULT_MODEL_NAME,
            {},
            True,
            "on a CPU the embedded model's fp32 weights (0.5 GB) are read at every decode step and that read is "
            "most of the step: decode follows the bytes, as the course teaches",
        )
    if bandwidth_gbps is None:
        raise ValueError("course_model on a GPU needs bandwidth_gbps: pass machine_ceilings().peak.bandwidth_gbps")
    probe = LLMEngine(device=device, kv_cache_memory_gib=PROBE_KV_GIB, max_model_len=PROBE_MAX_MODEL_LEN)
    choice = _choose(probe, bandwidth_gbps)
    chosen = _named(choice.name, choice.reason())
    chosen.choice, chosen.probe_engine = choice, probe
    return chosen


def _is_cuda(device: str) -> bool:
    return device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())


def _choose(probe: LLMEngine, bandwidth_gbps: float) -> ModelChoice:
    """Time the embedded model's batch-1 decode step on the device, then choose."""
    prompt = text_prompts(probe.tokenizer, 64, 1)
    warm_up(probe, prompt, output_tokens=8)
    step_s = statistics.median(minieng_decode(probe, prompt, 16)[0] for _ in range(3))
    dtype_bytes = probe.dtype.itemsize
    per_layer_s = fixed_cost_per_layer_s(step_s, probe.model_config, dtype_bytes, bandwidth_gbps * 1e9)
    return choose_model(bandwidth_gbps * 1e9, device_free_bytes(probe.device), dtype_bytes, per_layer_s)


def _named(model: str, why: str) -> CourseModel:
    """A model the reader (or the choice) named: a published shape, or what ``LLMEngine(model=...)`` loads."""
    if model not in PUBLISHED_SHAPES:
        return CourseModel(model, {"model": model}, True, why)
    hub_id = PUBLISHED_CHECKPOINTS.get(model)
    if hub_id and downloads_allowed():
        try:
            resolve_model_dir(hub_id)  # downloads it now, once
            return CourseModel(hub_id, {"model": hub_id}, True, why)
        except ValueError as e:
            why = f"{why} (its checkpoint could not be downloaded: {e})"
    return CourseModel(model, {"model": model, "load_format": "dummy"}, False, why)
