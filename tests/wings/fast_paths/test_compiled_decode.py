"""``compiled_decode.decode_forward`` (its attention the opaque ``minieng::paged_decode`` operator) gives
the logits and the K/V that ``LlamaForCausalLM.forward`` gives on the same decode step: eager, and
compiled whole (``torch.compile``, through the engine's ``compilation.run_decode``), in float32 and in W8A8 (fbgemm's product an opaque operator too)."""

from __future__ import annotations

import pytest
import torch

from minieng.wings.fast_paths import compilation
from minieng.core.attention import build_metadata
from minieng.wings.fast_paths.compiled_decode import decode_forward
from minieng.core.kv_cache import KVCache
from minieng.wings.quantization.quantization import quantize_model

BLOCK = 4
CPU = torch.device("cpu")


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("scheme", [None, "w8a8"])
def test_decode_forward_equals_the_model_forward_on_a_decode_step(tiny_llama, scheme, compiled):
    if compiled and compilation.compiler_missing(CPU) is not None:
        pytest.skip("torch.compile on a CPU needs a C++ compiler")
    if scheme and "fbgemm" not in torch.backends.quantized.supported_engines:
        pytest.skip("W8A8 on a CPU needs fbgemm")
    model = tiny_llama[1].model
    model = quantize_model(model, scheme, 64) if scheme else model
    cache = KVCache(model.config, 16, BLOCK, torch.float32, "cpu")
    prompts = [list(range(3, 10)), list(range(20, 33))]  # 7 and 13 tokens: blocks 0-1 and 2-5
    tables = [[0, 1], [2, 3, 4, 5]]
    slots = [t[p // BLOCK] * BLOCK + p % BLOCK for p_, t in zip(prompts, tables) for p in range(len(p_))]
    chunks = [(len(p), t, len(p)) for p, t in zip(prompts, tables)]
    meta = build_metadata(slots, [], chunks, BLOCK, cache.null_block, CPU)
    positions = torch.tensor([p for prompt in prompts for p in range(len(prompt))])
    model(torch.tensor(prompts[0] + prompts[1]), positions, cache, meta, torch.tensor([6, 19]))

    ids, pos = torch.tensor([11, 40]), torch.tensor([7, 13])  # each sequence's next token
    meta = build_metadata(
        [1 * BLOCK + 3, 5 * BLOCK + 1], [(tables[0], 8), (tables[1], 14)], [], BLOCK, cache.null_block, CPU
    )
    theirs = KVCache(model.config, 16, BLOCK, torch.float32, "cpu")
    theirs.kv.copy_(cache.kv)
    expected = model(ids, pos, theirs, meta, torch.arange(2))
    if compiled:  # as the engine runs it
        logits = compilation.run_decode(compilation.compile_decode_step(), model, cache, ids, pos, meta)
    else:
        rope = torch.view_as_real(model.rope.tables(pos))
        with torch.inference_mode():
            logits = decode_forward(
                model, ids, rope, cache.kv, meta.slot_mapping, meta.decode_block_tables, meta.decode_mask
            )
    # W8A8 compiled: the activation scales are computed by inductor's code, whose rounding of x / s
    # may differ from eager's by an ulp, and flip a code by one step on some CPU: a step's worth on
    # this tiny model (on the default model such flips move logits by units: test_quant_quality).
    atol = 1e-3 * expected.abs().max().item() if scheme and compiled else None
    torch.testing.assert_close(logits, expected, atol=atol, rtol=0 if atol else None)
    torch.testing.assert_close(cache.kv, theirs.kv, atol=atol, rtol=0 if atol else None)
