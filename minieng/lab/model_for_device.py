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
are real, else the embedded default. A checkpoint fetched from the Hub says so in ``CourseModel.lines``:
its size, and the time its download took (``fetch_checkpoint``).

``course_speculative_pair()`` is notebook 09's pair: on a CPU the embedded model with its int8 self-draft;
on a GPU the pair of real checkpoints ``measure.speculative_pair.choose_pair`` picks from the device's
measured ceilings, its free memory and the fixed cost per layer timed as above, with the cost ratio c it
predicts. Random weights are refused there (acceptance on them means nothing): without downloads and
without the pair in the local Hugging Face cache it raises, saying how to allow downloads.
"""

from __future__ import annotations

import gc
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from minieng.config import DEFAULT_MODEL_NAME, PUBLISHED_CHECKPOINTS, PUBLISHED_SHAPES, ModelConfig, published_config
from minieng.device import dtype_choice, select_device
from minieng.engine.llm_engine import LLMEngine
from minieng.lab.probes import minieng_decode, warm_up
from minieng.measure.model_choice import MEMORY_FRACTION, ModelChoice, choose_model, fixed_cost_per_layer_s
from minieng.measure.napkin import TORCH_DTYPE_NAMES, measured_device
from minieng.measure.peaks import Peak, device_free_bytes
from minieng.measure.speculative_pair import MAX_COST_RATIO, SPECULATIVE_PAIRS, PairChoice, choose_pair
from minieng.measure.workloads import text_prompts
from minieng.model.loader import load_config, resolve_model_dir

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
        fetched: where its real checkpoint came from, with its size and download time (``fetch_checkpoint``);
            "" when nothing was fetched.
    """

    name: str
    engine_args: dict
    real_weights: bool
    why: str
    choice: ModelChoice | None = None
    probe_engine: LLMEngine | None = field(default=None, repr=False)
    fetched: str = ""

    def lines(self) -> list[str]:
        """What a notebook prints: the model, its weights, where they came from, and why."""
        weights = "real weights" if self.real_weights else "random weights: the timings are real, the text is noise"
        return (
            [f"model: {self.name} ({weights})"]
            + ([f"weights: {self.fetched}"] if self.fetched else [])
            + [f"why: {self.why}"]
        )

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


@dataclass(frozen=True)
class LessonShape:
    """The shape of the model the lessons measure on this device, as far as it is known without weights
    (``lesson_shape``): ``name``, its ``config`` (a ``ModelConfig``) and ``why`` this one, in a sentence."""

    name: str
    config: ModelConfig
    why: str


def lesson_shape(model: str | None = None, device: str = "auto") -> LessonShape:
    """The shape ``course_model(model)`` would measure on ``device``, read from a config only (no weights,
    no timing): what the primer (notebook 00) draws.

    The model named by ``model`` or ``$MINIENG_MODEL`` when its shape is known without its weights (a
    published shape, its checkpoint's Hub id, or a local folder); else, on a CPU, the embedded default
    that ``course_model`` measures there. On a GPU with nothing named, ``course_model`` chooses from the
    measured ceilings and a decode step it times on the device: no config can say which before that, so
    the embedded default's shape stands in, and ``why`` says so.
    """
    named = model or os.environ.get(MODEL_ENV) or None
    shape = {hub_id: name for name, hub_id in PUBLISHED_CHECKPOINTS.items()}.get(named, named)
    if shape in PUBLISHED_SHAPES:
        return LessonShape(named, published_config(shape), f"the model the lessons measure ({named}), from its shape")
    if named and Path(named).is_dir():
        return LessonShape(named, load_config(named)[2], f"the model the lessons measure ({named}), from its config")
    config = load_config(None)[2]
    if named:
        why = f"the embedded default's shape: {named}'s needs its checkpoint, which the lessons load"
    elif _is_cuda(device):
        why = (
            "the embedded default's shape: on this GPU each lesson chooses a larger model from the "
            "ceilings measured in part 2 and a timed decode step, and prints it; the formulas are the same"
        )
    else:
        why = "the model every lesson measures on a CPU (the embedded default)"
    return LessonShape(DEFAULT_MODEL_NAME, config, why)


def _is_cuda(device: str) -> bool:
    return device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())


def _probe_fixed_cost_per_layer_s(probe: LLMEngine, bandwidth_gbps: float) -> float:
    """Time the embedded model's batch-1 decode step on the device: the step's fixed cost per layer, s."""
    prompt = text_prompts(probe.tokenizer, 64, 1)
    warm_up(probe, prompt, output_tokens=8)
    step_s = statistics.median(minieng_decode(probe, prompt, 16)[0] for _ in range(3))
    return fixed_cost_per_layer_s(step_s, probe.model_config, probe.dtype.itemsize, bandwidth_gbps * 1e9)


def _choose(probe: LLMEngine, bandwidth_gbps: float) -> ModelChoice:
    """Time the embedded model's batch-1 decode step on the device, then choose."""
    per_layer_s = _probe_fixed_cost_per_layer_s(probe, bandwidth_gbps)
    return choose_model(bandwidth_gbps * 1e9, device_free_bytes(probe.device), probe.dtype.itemsize, per_layer_s)


def _named(model: str, why: str) -> CourseModel:
    """A model the reader (or the choice) named: a published shape, or what ``LLMEngine(model=...)`` loads."""
    if model not in PUBLISHED_SHAPES:
        return CourseModel(model, {"model": model}, True, why)
    hub_id = PUBLISHED_CHECKPOINTS.get(model)
    if hub_id and downloads_allowed():
        try:
            _, fetched = fetch_checkpoint(hub_id)  # downloads it now, once
            return CourseModel(hub_id, {"model": hub_id}, True, why, fetched=fetched)
        except ValueError as e:
            why = f"{why} (its checkpoint could not be downloaded: {e})"
    return CourseModel(model, {"model": model, "load_format": "dummy"}, False, why)


def _cached_checkpoint(hub_id: str) -> Path | None:
    """The local Hugging Face cache's snapshot of ``hub_id`` with its weights, or None; never the network."""
    from huggingface_hub import snapshot_download  # lazy: only a checkpoint needs the Hub client

    try:
        path = Path(snapshot_download(hub_id, local_files_only=True))
    except Exception:  # not cached (LocalEntryNotFoundError), or a cache it cannot read: nothing local either way
        return None
    return path if any(path.glob("*.safetensors")) else None


def _folder_bytes(path: Path) -> int:
    """The bytes of the files under ``path`` (a snapshot's links followed to their blobs)."""
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def fetch_checkpoint(hub_id: str) -> tuple[Path, str]:
    """A real checkpoint's local folder, and a line saying where it came from: the local Hugging Face
    cache, or a download from the Hub now, with its size (GB) and the download's time (s) and rate.

    Downloads only where huggingface_hub is online (``HF_HUB_OFFLINE`` not set to 1; on Colab the first
    cell's ``minieng.course.allow_hub_downloads``). Raises ``ValueError`` (``loader.resolve_model_dir``'s)
    when the Hub cannot be reached or refuses the id."""
    cached = _cached_checkpoint(hub_id)
    if cached is not None:
        return cached, f"{hub_id}, {_folder_bytes(cached) / 1e9:.2f} GB, read from the local Hugging Face cache"
    start = time.perf_counter()
    path = resolve_model_dir(hub_id)
    took_s = max(time.perf_counter() - start, 1e-9)
    size = _folder_bytes(path)
    return path, (
        f"{hub_id}, downloaded from the Hugging Face Hub: {size / 1e9:.2f} GB in {took_s:.1f} s "
        f"({size / took_s / 1e6:,.0f} MB/s), kept in the local cache for the next lessons"
    )


# What notebook 09 says when a GPU would have to run the pair on random weights.
OFFLINE_REFUSAL = (
    "notebook 09 measures speculative decoding on real weights only: acceptance on random weights means "
    "nothing. On this GPU it needs one of these target/draft pairs: {pairs}, and downloads are not allowed "
    "(HF_HUB_OFFLINE is not 0) and no pair is in the local Hugging Face cache. Set HF_HUB_OFFLINE=0 before "
    "starting Jupyter (`make lab HF_HUB_OFFLINE=0`; on Colab the first cell allows downloads), or download "
    "a pair where there is network (`hf download ID` for both ids)."
)
PROBE_NOTE = "the embedded model's batch-1 decode step, timed on this device"


@dataclass
class SpeculativePair:
    """The target/draft pair notebook 09 measures.

    Attributes:
        target, draft: what the reader sees (Hub ids on a GPU; on a CPU the embedded model, and its int8 copy).
        engine_args: ``LLMEngine(**engine_args, num_speculative_tokens=k, ...)`` loads the pair (the
            speculative method, the target's and the draft's folders or the draft's quantization).
        why: why this pair, in a sentence.
        on_gpu: the pair of real checkpoints chosen for a GPU (False: the CPU's self-draft).
        prediction: the napkin prediction that chose it, with its cost ratio c (None on a CPU).
        fetched: where each checkpoint came from (``fetch_checkpoint``'s lines).
    """

    target: str
    draft: str
    engine_args: dict
    why: str
    on_gpu: bool = False
    prediction: PairChoice | None = None
    fetched: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        """The pair in words, "target ..., draft ..." (notebook 09 keys its cached results with it)."""
        return f"target {self.target}, draft {self.draft}"

    @property
    def predicted_c(self) -> float | None:
        """The cost ratio c the napkin model predicts (draft step / target step at batch 1); None on a CPU."""
        return None if self.prediction is None else self.prediction.cost_ratio

    def lines(self) -> list[str]:
        """What notebook 09 prints before measuring: the pair, why, the predicted c, where the weights came from."""
        lines = [self.name, f"why: {self.why}"]
        if self.prediction is not None:
            lines += self.prediction.lines()
        return lines + [f"weights: {f}" for f in self.fetched]


def course_speculative_pair(
    peak: Peak | None = None, device: str = "auto", fixed_cost_per_layer_s: float | None = None
) -> SpeculativePair:
    """Notebook 09's target/draft pair for this device; see the module's docstring.

    Args:
        peak: the device's measured ceilings (``machine_ceilings().peak``); a GPU's choice needs them.
        device: where the engines will run (``"auto"``: CUDA when available).
        fixed_cost_per_layer_s: a decode step's fixed cost per layer on the device, s; None times it
            (the embedded model's step, as ``course_model`` does).
    Raises:
        ValueError: a GPU without ``peak``; on a GPU, no pair of real checkpoints to be had (downloads
            not allowed and none in the local cache: ``OFFLINE_REFUSAL``, which says to set
            ``HF_HUB_OFFLINE=0``), a download that failed, or no pair that fits the free memory.
    """
    if not _is_cuda(device):
        return SpeculativePair(
            f"the embedded {DEFAULT_MODEL_NAME}",
            "the same weights in int8",
            {"speculative_method": "draft", "draft_quantization": "int8"},
            "on a CPU, the embedded model (real weights, no download) drafts for itself with its linear layers in "
            "int8: a quarter of the bytes per weight, so a cheaper step where steps follow their bytes",
        )
    if peak is None:
        raise ValueError("course_speculative_pair on a GPU needs peak: pass machine_ceilings().peak")
    pairs, local = list(SPECULATIVE_PAIRS), {}
    if not downloads_allowed():
        wanted = {PUBLISHED_CHECKPOINTS[name] for pair in pairs for name in pair}
        local = {hub_id: path for hub_id in sorted(wanted) if (path := _cached_checkpoint(hub_id)) is not None}
        pairs = [p for p in pairs if all(PUBLISHED_CHECKPOINTS[name] in local for name in p)]
        if not pairs:
            raise ValueError(OFFLINE_REFUSAL.format(pairs=_pairs_text()))
    fixed_note = "given by the caller"
    if fixed_cost_per_layer_s is None:
        probe = LLMEngine(device=device, kv_cache_memory_gib=PROBE_KV_GIB, max_model_len=PROBE_MAX_MODEL_LEN)
        fixed_cost_per_layer_s = _probe_fixed_cost_per_layer_s(probe, peak.bandwidth_gbps)
        del probe  # its weights and pool leave the device before the free memory is read
        gc.collect()
        fixed_note = PROBE_NOTE
    torch_device = select_device(device)
    dtype = TORCH_DTYPE_NAMES[dtype_choice(torch_device)[0]]
    free = device_free_bytes(torch_device)
    choice = choose_pair(measured_device(peak, free, dtype), fixed_cost_per_layer_s, pairs=pairs)
    folders, fetched = [], []
    for hub_id in choice.checkpoints:
        if hub_id in local:
            folder, line = local[hub_id], f"{hub_id}, read from the local Hugging Face cache"
        else:
            folder, line = fetch_checkpoint(hub_id)  # ValueError when the Hub cannot give it: no random fallback
        folders.append(str(folder))
        fetched.append(line)
    target_id, draft_id = choice.checkpoints
    fit = f"fit {MEMORY_FRACTION:.0%} of the {free / 1e9:.1f} GB free"
    why = (
        f"the largest pair of one tokenizer whose weights {fit} and whose predicted c is under {MAX_COST_RATIO}"
        if choice.pays
        else f"of the pairs whose weights {fit}, none has a predicted c under {MAX_COST_RATIO}: this one has the lowest"
    ) + f" (the fixed cost per layer: {fixed_note})"
    return SpeculativePair(
        target_id,
        draft_id,
        {"model": folders[0], "speculative_method": "draft", "draft_model": folders[1]},
        why,
        on_gpu=True,
        prediction=choice,
        fetched=tuple(fetched),
    )


def _pairs_text() -> str:
    return "; ".join(f"{PUBLISHED_CHECKPOINTS[t]} with {PUBLISHED_CHECKPOINTS[d]}" for t, d in SPECULATIVE_PAIRS)
