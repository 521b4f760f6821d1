"""Which target/draft pair speculative decoding should run on a device, and its cost ratio c on paper.

Speculative decoding pays when a draft step is several times cheaper than a target step: with an
acceptance rate a and k drafts a step, the speedup is about E(a, k) / (k c + v), where c = a draft
step's time / a target step's time at batch 1 and v ~ 1 where decode is memory-bound
(docs/architecture.md, speculative decoding). The time of a batch-1 decode step is, to first order,

    step_s = floor_s + fixed_cost_per_layer_s x layers

``floor_s`` is the napkin floor of the step (``napkin.napkin_estimate``: its bytes over the bandwidth,
or its FLOPs over the peak where those take longer) and the second term the fixed cost a step pays
whatever its size, per layer (launches, host work: ``model_choice``'s model, measured on the device
from the embedded model's step by ``model_choice.fixed_cost_per_layer_s``). So c follows the bytes
where the bytes dominate and the layers where the fixed cost does: SmolLM2-135M reads 13x fewer bytes
than SmolLM2-1.7B but has 30 layers to its 24, so it is a cheap draft only where reading the 1.7B's
weights takes much longer than launching its layers (a T4's 320 GB/s), not on an H200 whose decode
steps are mostly fixed cost. With no measured fixed cost (0: the floors alone) c is the ratio of the
floors, about the ratio of the bytes.

``SPECULATIVE_PAIRS`` are pairs of published shapes with one tokenizer and one vocabulary (a draft must
match its target's token ids: ``loader.check_same_tokenizer``), largest target first. ``choose_pair``
takes the first pair whose weights fit in ``model_choice.MEMORY_FRACTION`` of the device's free memory
and whose predicted c is under ``MAX_COST_RATIO``; when no fitting pair's is, the fitting pair of the
lowest c, and ``PairChoice.lines`` says speculation can gain little there.

Pure arithmetic: no torch, no device. ``lab.course_speculative_pair`` measures the fixed cost and fetches the
pair's weights.
"""

from __future__ import annotations

from dataclasses import dataclass

from minieng.config import PUBLISHED_CHECKPOINTS, published_config
from minieng.measure.model_choice import CONTEXT_TOKENS, MEMORY_FRACTION
from minieng.measure.napkin import DeviceSpec, NapkinEstimate, format_seconds, napkin_estimate

# (target, draft): ``config.PUBLISHED_SHAPES`` names of one tokenizer and vocabulary, largest target
# first, each published on the Hub without a gate (``config.PUBLISHED_CHECKPOINTS``). Qwen2.5-7B would
# be the next target, but its embedding has more rows than the 0.5B's (``config``'s note).
SPECULATIVE_PAIRS: tuple[tuple[str, str], ...] = (
    ("Qwen2.5-3B-Instruct", "Qwen2.5-0.5B-Instruct"),
    ("SmolLM2-1.7B", "SmolLM2-135M"),
)
# c under which a pair is worth the lesson: at k = 4 and c = 0.3 a step costs k c + v = 2.2 target
# steps, and an acceptance rate of 0.7 (E = 2.77 tokens a step) still gains about 1.26x.
MAX_COST_RATIO = 0.3
PROMPT_TOKENS = 64  # the prompt of the napkin estimates (their TTFT floors; c reads their decode steps)


@dataclass(frozen=True)
class PairChoice:
    """A target/draft pair on a device, with the prediction of its cost ratio c.

    Attributes:
        target, draft: ``config.PUBLISHED_SHAPES`` names.
        target_estimate, draft_estimate: their napkin floors at batch 1, ``model_choice.CONTEXT_TOKENS`` of
            context, in ``dtype`` (``napkin.NapkinEstimate``).
        target_layers, draft_layers: their decoder layers.
        fixed_cost_per_layer_s: a decode step's fixed cost per layer, s (0: the floors alone).
        free_memory_bytes: the memory the pair's weights must fit in ``MEMORY_FRACTION`` of, bytes.
        device: the device's name.
    """

    target: str
    draft: str
    target_estimate: NapkinEstimate
    draft_estimate: NapkinEstimate
    target_layers: int
    draft_layers: int
    fixed_cost_per_layer_s: float
    free_memory_bytes: float
    device: str

    @property
    def weights_bytes(self) -> float:
        """The target's and the draft's weights together, bytes."""
        return self.target_estimate.weights_bytes + self.draft_estimate.weights_bytes

    @property
    def fits(self) -> bool:
        """Both weights fit in ``MEMORY_FRACTION`` of the free memory (the rest: KV pools, graphs, activations)."""
        return self.weights_bytes <= MEMORY_FRACTION * self.free_memory_bytes

    @property
    def target_step_s(self) -> float:
        """The target's predicted batch-1 decode step: its floor + fixed cost per layer x its layers, s."""
        return self.target_estimate.tpot_floor_s + self.fixed_cost_per_layer_s * self.target_layers

    @property
    def draft_step_s(self) -> float:
        """The draft's predicted batch-1 decode step, s (as ``target_step_s``)."""
        return self.draft_estimate.tpot_floor_s + self.fixed_cost_per_layer_s * self.draft_layers

    @property
    def cost_ratio(self) -> float:
        """c: the draft's predicted step / the target's."""
        return self.draft_step_s / self.target_step_s

    @property
    def floors_cost_ratio(self) -> float:
        """c from the floors alone (no fixed cost): about the ratio of the bytes read."""
        return self.draft_estimate.tpot_floor_s / self.target_estimate.tpot_floor_s

    @property
    def pays(self) -> bool:
        """c < ``MAX_COST_RATIO``: the draft is cheap enough for speculation to gain at usual acceptance."""
        return self.cost_ratio < MAX_COST_RATIO

    @property
    def checkpoints(self) -> tuple[str, str]:
        """The Hub ids of the target's and the draft's real weights (``config.PUBLISHED_CHECKPOINTS``)."""
        return PUBLISHED_CHECKPOINTS[self.target], PUBLISHED_CHECKPOINTS[self.draft]

    def lines(self) -> list[str]:
        """The prediction as text, printed before anything is measured."""
        f = self.fixed_cost_per_layer_s
        t, d = self.target_estimate, self.draft_estimate

        def step(est: NapkinEstimate, layers: int, step_s: float) -> str:
            fixed = f" + {layers} layers x {format_seconds(f)} fixed = {format_seconds(step_s)}" if f else ""
            return f"floor {format_seconds(est.tpot_floor_s)} ({est.weights_bytes / 1e9:.2f} GB of weights){fixed}"

        fixed_note = (
            f"with a fixed cost of {format_seconds(f)} per layer"
            if f
            else "from the floors alone (no fixed cost measured: c is about the ratio of the bytes)"
        )
        lines = [
            f"target {self.target}, draft {self.draft} ({self.device}, {t.dtype}): napkin math, before measuring",
            f"  target step: {step(t, self.target_layers, self.target_step_s)}",
            f"  draft step:  {step(d, self.draft_layers, self.draft_step_s)}",
            f"  predicted c = draft step / target step = {self.cost_ratio:.2f}, {fixed_note}",
        ]
        if f:
            lines.append(f"  (the floors alone would give c = {self.floors_cost_ratio:.2f})")
        if not self.pays:
            lines.append(
                f"  c >= {MAX_COST_RATIO}: the draft's step is not several times cheaper than the target's here; a "
                f"step's fixed cost follows its layers ({self.draft_layers} against {self.target_layers}), so "
                "speculation can gain little on this device"
            )
        return lines


def predict_pair(
    target: str,
    draft: str,
    device: DeviceSpec,
    fixed_cost_per_layer_s: float = 0.0,
    free_memory_bytes: float | None = None,
    dtype: str | None = None,
) -> PairChoice:
    """The prediction for one pair of published shapes on ``device``.

    Args:
        fixed_cost_per_layer_s: a decode step's fixed cost per layer on the device, s (0: the floors alone).
        free_memory_bytes: the memory free for the pair (default: the device's, ``device.memory_bytes``).
        dtype: a ``napkin.NAPKIN_DTYPES`` name (default: the device's own, ``DeviceSpec.native_dtype``).
    Raises:
        ValueError: an unknown shape or dtype, a negative fixed cost, a draft whose vocabulary differs
            from the target's.
    """
    if fixed_cost_per_layer_s < 0:
        raise ValueError(f"fixed_cost_per_layer_s={fixed_cost_per_layer_s} must be >= 0 s")
    dtype = dtype or device.native_dtype()
    t_cfg, d_cfg = published_config(target), published_config(draft)
    if t_cfg.vocab_size != d_cfg.vocab_size:
        raise ValueError(
            f"{draft} has {d_cfg.vocab_size:,} tokens in its vocabulary and {target} {t_cfg.vocab_size:,}: "
            "a draft must read and write its target's token ids"
        )

    def estimate(name, cfg):
        return napkin_estimate(cfg, device, dtype, 1, PROMPT_TOKENS, CONTEXT_TOKENS, model_name=name)

    return PairChoice(
        target=target,
        draft=draft,
        target_estimate=estimate(target, t_cfg),
        draft_estimate=estimate(draft, d_cfg),
        target_layers=t_cfg.num_hidden_layers,
        draft_layers=d_cfg.num_hidden_layers,
        fixed_cost_per_layer_s=fixed_cost_per_layer_s,
        free_memory_bytes=device.memory_bytes if free_memory_bytes is None else free_memory_bytes,
        device=device.name,
    )


def choose_pair(
    device: DeviceSpec,
    fixed_cost_per_layer_s: float = 0.0,
    free_memory_bytes: float | None = None,
    dtype: str | None = None,
    pairs: tuple[tuple[str, str], ...] | list[tuple[str, str]] = SPECULATIVE_PAIRS,
) -> PairChoice:
    """The first of ``pairs`` (largest target first) whose weights fit and whose c is under
    ``MAX_COST_RATIO``; if none that fits is, the fitting pair of the lowest c (``PairChoice.pays``
    False). Arguments as ``predict_pair``'s.

    Raises:
        ValueError: no pair given, or none whose weights fit in ``MEMORY_FRACTION`` of the free memory
            (free device memory, or run the lesson on a CPU).
    """
    if not pairs:
        raise ValueError("choose_pair: no pair to choose from")
    preds = [predict_pair(t, d, device, fixed_cost_per_layer_s, free_memory_bytes, dtype) for t, d in pairs]
    fits = [p for p in preds if p.fits]
    if not fits:
        smallest = min(preds, key=lambda p: p.weights_bytes)
        raise ValueError(
            f"no speculative pair fits {device.name}: the smallest, {smallest.target} with {smallest.draft}, has "
            f"{smallest.weights_bytes / 1e9:.2f} GB of weights and {MEMORY_FRACTION:.0%} of the "
            f"{smallest.free_memory_bytes / 1e9:.2f} GB free is {MEMORY_FRACTION * smallest.free_memory_bytes / 1e9:.2f} "
            "GB: free device memory"
        )
    return next((p for p in fits if p.pays), min(fits, key=lambda p: p.cost_ratio))
