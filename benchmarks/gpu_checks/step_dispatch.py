"""What a decode step dispatches, for issue 33's predictions: the computing ops of a bf16 decode
layer, eager and on the forward the CUDA graphs capture (``ops-eager-bf16``, ``ops-graphed-bf16``),
the masks SDPA gets there (``no-bool-mask``), and the host syncs a sampling step makes
(``sampling-syncs``)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from contextlib import contextmanager
from unittest import mock

import torch
import torch.nn.functional as F

from minieng.config import SamplingParams
from minieng.wings.fast_paths.cuda_graph import DecodeGraphs
from minieng.engine.llm_engine import LLMEngine
from minieng.core.sampling import KeyedRandom, sample
from .verdicts import decide, untested
from minieng.lab.gpu_utilization import decode_ops, decoding
from minieng.measure.op_count import OpCounter, count_layer_ops
from minieng.measure.workloads import text_prompts


@contextmanager
def sdpa_spy():
    """Records the ``attn_mask`` of every ``F.scaled_dot_product_attention`` call made inside (the
    model calls it through ``torch.nn.functional``); yields the list of masks."""
    masks: list = []
    sdpa = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        masks.append(kwargs.get("attn_mask", args[3] if len(args) > 3 else None))
        return sdpa(*args, **kwargs)

    with mock.patch.object(F, "scaled_dot_product_attention", spy):
        yield masks


def decode_layer_ops(engine: LLMEngine) -> list[dict]:
    """On a bf16 eager engine: the computing ops of a decode layer (batch 4) on the eager forward
    (``gpu_utilization.decode_ops``) and on the forward the CUDA graphs capture (``DecodeGraphs``
    with ``capture=False``, run eagerly on its static buffers), and the masks SDPA got in both."""
    prompts = text_prompts(engine.tokenizer, 20, 4)
    layers = engine.model.layers
    with sdpa_spy() as masks:
        eager = decode_ops(engine, prompts)
        graphs = DecodeGraphs(engine.model, engine.runner.kv_cache, 8, engine.max_model_len, 1 << 40, capture=False)
        with decoding(engine, prompts, 4) as ids:
            seqs = [engine.requests[i].seq for i in ids]
            lay = engine.runner.layout([(seq, 1) for seq in seqs])
            with count_layer_ops(layers) as counter:
                ran = graphs.run(lay) is not None  # None: no bucket fits (nothing was counted)
    graphed = counter.result().computing / len(layers)
    bool_masks = sum(m is not None and m.dtype == torch.bool for m in masks)
    dtype = str(engine.dtype).removeprefix("torch.")
    mask_details = {"sdpa_calls": len(masks), "mask_dtypes": sorted({str(m.dtype) for m in masks if m is not None})}
    return [
        decide("ops-eager-bf16", eager["computing_per_layer"], f"{dtype}, batch 4", eager),
        decide("ops-graphed-bf16", graphed, f"{dtype}, batch 4", {"ops": dict(counter.result().ops)})
        if ran
        else untested("ops-graphed-bf16", "no graph bucket fitted the step: nothing ran"),
        decide("no-bool-mask", bool_masks, f"{len(masks)} SDPA calls", mask_details)
        if masks
        else untested("no-bool-mask", "no SDPA call was seen: nothing to decide", mask_details),
    ]


def count_host_syncs(fn: Callable[[], object], device: torch.device) -> int:
    """Host syncs while ``fn()`` runs: on CUDA every synchronizing operation
    (``torch.cuda.set_sync_debug_mode("warn")``: a device-to-host copy, ``.item()``, a blocking
    host-to-device copy); on a CPU the transfers that would be device-to-host on a GPU
    (``Tensor.tolist`` and ``_local_scalar_dense``: ``.item()``, ``int(t)``)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        previous = torch.cuda.get_sync_debug_mode()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                fn()
            finally:
                torch.cuda.set_sync_debug_mode(previous)
        return sum("synchroniz" in str(w.message) for w in caught)
    transfers = []
    tolist = torch.Tensor.tolist

    def counted(t):
        transfers.append("tolist")
        return tolist(t)

    with mock.patch.object(torch.Tensor, "tolist", counted), OpCounter() as ops:
        fn()
    return len(transfers) + ops.result().ops.get("_local_scalar_dense", 0)


def sampling_syncs(device: torch.device) -> list[dict]:
    """``sampling.sample`` over 8 rows on ``device``: greedy rows and non-greedy rows of two settings
    (temperature with top-p, temperature with top-k), as tests/engine/test_llm_engine.py samples;
    each row's ``KeyedRandom`` on ``device``, as ``LLMEngine`` builds them (noise drawn on the host
    would reach a GPU by a copy the engine does not make)."""
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(8, 512, generator=gen) * 2).to(device)
    hot, cold = SamplingParams(temperature=1.0, top_p=0.9), SamplingParams(temperature=0.5, top_k=5)
    params = [hot, SamplingParams(temperature=0), cold, hot, hot, cold, SamplingParams(temperature=0), hot]
    rngs = [KeyedRandom(i, device) for i in range(8)]
    positions = list(range(8))
    sample(logits, params, rngs, positions)  # first calls (lazy initialisation) outside the count
    syncs = count_host_syncs(lambda: sample(logits, params, rngs, positions), device)
    how = (
        "torch.cuda.set_sync_debug_mode: every synchronizing call"
        if device.type == "cuda"
        else "a CPU counts device-to-host transfers only (tolist, item); a GPU also counts blocking "
        "host-to-device copies"
    )
    return [decide("sampling-syncs", syncs, how)]
