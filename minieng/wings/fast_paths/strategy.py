"""The fast paths as one forward strategy the model runner is given (``ModelRunner.fast``).

``build_fast_paths`` builds what ``EngineConfig`` asks for on one runner; ``FastPaths`` runs each
step by the fastest path that fits it, or hands it back to the runner's eager forward. With
``attention_backend="triton"`` one-query decodes attend through the Triton kernel
(``AttentionMetadata.decode_attention``), eager or graphed.
"""

from __future__ import annotations

import torch

from minieng.config import EngineConfig
from minieng.core.model_runner import ModelRunner, StepLayout
from minieng.wings.fast_paths.compilation import (
    MIN_DECODE_WIDTH,
    NOT_COMPILED,
    compile_model,
    fits_decode_step,
    run_decode,
)
from minieng.wings.fast_paths.cuda_graph import capture_decode_graphs
from minieng.wings.fast_paths.forward_paths import COMPILED_REGIONS, COMPILED_STEP, CUDA_GRAPH, fall_back


class FastPaths:
    """What was built for one runner: ``graphs`` (``cuda_graph.DecodeGraphs``) or None, the layers'
    compiled ``regions`` and the ``compiled_decode`` step (``compilation.CompiledParts``), the
    seconds compiling took (``compile_s``: None when nothing compiled), and ``dropped_paths``
    (path -> why it failed to build)."""

    def __init__(self, graphs=None, compiled=None, dropped_paths: dict[str, str] | None = None):
        compiled = compiled or NOT_COMPILED
        self.graphs, self.regions, self.compiled_decode = graphs, compiled.regions, compiled.decode
        self.compile_s, self.dropped_paths = compiled.compile_s, dropped_paths or {}

    def __call__(self, runner: ModelRunner, lay: StepLayout) -> torch.Tensor | None:
        """The logits [rows asked, vocab] of ``lay`` by the fastest path that fits it, or None
        (the runner's eager forward). Sets ``runner.last_forward_path``."""
        meta = None
        if not lay.chunks and self.graphs is not None and (logits := self.graphs.run(lay)) is not None:
            runner.last_forward_path = CUDA_GRAPH
            return sampled_rows(logits, lay)
        if not lay.chunks and self.compiled_decode is not None:
            input_ids, positions, meta, logits_indices = runner.tensors(lay)
            if fits_decode_step(meta):
                runner.last_forward_path = COMPILED_STEP
                logits = run_decode(self.compiled_decode, runner.model, runner.kv_cache, input_ids, positions, meta)
                return sampled_rows(logits, lay)
        if self.regions is None:
            return None
        if meta is None:
            input_ids, positions, meta, logits_indices = runner.tensors(lay)
        runner.last_forward_path = COMPILED_REGIONS
        return runner.model(input_ids, positions, runner.kv_cache, meta, logits_indices, self.regions)


def build_fast_paths(
    config: EngineConfig,
    runner: ModelRunner,
    max_model_len: int,
    compile: bool | None = None,
    query_lens: tuple[int, ...] | None = None,
) -> FastPaths:
    """Give ``runner`` its fast paths, built in the order each needs the last: the Triton decode
    kernels' variants compiled on its pool (``triton_attention.warm_up``); with ``compile`` (default
    ``config.compile``) the compiled parts (``compilation.compile_model``); on CUDA the decode
    step's graphs for ``query_lens`` (``cuda_graph.capture_decode_graphs``). A fast path that fails
    to build leaves the slower one, with a warning and its reason in ``dropped_paths``; with
    ``config.strict_forward_paths`` it raises (``fall_back``). Sets the runner's attention seams
    (``decode_attention``, ``min_decode_width``); returns the strategy, for ``runner.fast``."""
    model, kv_cache = runner.model, runner.kv_cache
    use_attention_backend(config.attention_backend, runner)
    strict, dropped = config.strict_forward_paths, {}
    compiled = NOT_COMPILED
    if config.compile if compile is None else compile:
        compiled = fall_back(lambda: compile_model(model, kv_cache), NOT_COMPILED, strict, dropped)
    if compiled.decode is not None:
        runner.min_decode_width = MIN_DECODE_WIDTH
    graphs = fall_back(
        lambda: capture_decode_graphs(
            config, model, kv_cache, max_model_len, runner.max_gather_tokens, query_lens, compiled.regions
        ),
        None,
        strict,
        dropped,
    )
    return FastPaths(graphs, compiled, dropped)


def use_attention_backend(backend: str, runner: ModelRunner) -> None:
    """With ``backend="triton"``, have ``runner``'s one-query decodes attend through the Triton
    kernel, its variants compiled on the runner's pool now (``triton_attention.warm_up``: a run
    then compiles none); "sdpa" changes nothing."""
    if backend == "triton":
        from minieng.wings.fast_paths.triton_attention import decode_attention, warm_up  # lazy: triton is optional

        cache = runner.kv_cache
        warm_up(cache.layers[0].blocks, runner.model.layers[0].self_attn.num_heads, cache.null_block)
        runner.decode_attention = decode_attention


def sampled_rows(logits: torch.Tensor, lay: StepLayout) -> torch.Tensor:
    """The rows of ``logits`` [every row of ``lay``, vocab] that ``lay.logits_indices`` asks for:
    all of them, or fewer when a single-token row is a prompt chunk that stops mid-prompt."""
    if lay.logits_indices == list(range(len(lay.input_ids))):
        return logits
    return logits[torch.tensor(lay.logits_indices, dtype=torch.long, device=logits.device)]
