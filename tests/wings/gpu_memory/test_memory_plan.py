"""Will it fit? The plan's arithmetic on the real SmolLM2 shape, its refusals, and the engine's.

No weights are needed: the shape comes from a transformers ``LlamaConfig`` with SmolLM2-135M's
numbers (DESIGN.md section 10), and the engine test loads a tiny config from a temporary folder.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from minieng import EngineConfig, LLMEngine, ModelConfig, device
from minieng.engine import model_loading
from minieng.wings.gpu_memory.memory_plan import MemoryPlan, plan_memory
from minieng.units import GIB

ADVICE = ("smaller model", "max_model_len", "kv_cache_memory_gib")


def smollm2_hf_config():
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        rope_theta=100000.0,
    )


@pytest.fixture(scope="module")
def smollm2():
    return ModelConfig.from_hf(smollm2_hf_config())


def test_parameter_count_matches_the_transformers_model(smollm2):
    """num_params against the real module tree, built on the meta device (no memory, no weights)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        hf = AutoModelForCausalLM.from_config(smollm2_hf_config())
    assert smollm2.num_params == sum(p.numel() for p in hf.parameters())  # tied head counted once
    assert 134.4e6 < smollm2.num_params < 134.6e6  # DESIGN.md: ~134.5M


@pytest.mark.parametrize("dtype,dtype_bytes", [(torch.float32, 4), (torch.bfloat16, 2)])
def test_plan_arithmetic_on_the_smollm2_shape(smollm2, dtype, dtype_bytes):
    plan = plan_memory(smollm2, dtype, num_kv_blocks=100, block_size=16, device=torch.device("cpu"))
    assert plan.weight_bytes == smollm2.num_params * dtype_bytes
    # 2 (K and V) x 30 layers x 3 KV heads (GQA, not the 9 query heads) x head_dim 64 x dtype bytes.
    assert plan.kv_bytes_per_token == 2 * 30 * 3 * 64 * dtype_bytes
    assert plan.kv_tokens == 1600
    assert plan.kv_bytes == 1600 * 2 * 30 * 3 * 64 * dtype_bytes
    assert plan.device_bytes == plan.weight_bytes + plan.kv_bytes
    assert plan.device_type == "cpu" and plan.gpu_memory_bytes is None
    assert plan.host_bytes == plan.device_bytes  # a CPU run holds everything in RAM
    assert len(plan.lines()) == 5


def test_a_plan_sizes_its_pool_from_a_budget_and_plans_rank_zeros_share(smollm2):
    """num_kv_blocks=None: the blocks kv_cache_memory_gib holds; tensor_parallel_size=p: rank 0's
    share of the weights and of the pool (2 of the 3 KV heads for p = 2)."""
    cpu = torch.device("cpu")
    plan = plan_memory(smollm2, torch.float32, None, 16, cpu, kv_cache_memory_gib=0.5)
    assert plan.num_kv_blocks == int(0.5 * GIB) // (16 * 2 * 30 * 3 * 64 * 4)
    rank0 = plan_memory(smollm2, torch.float32, None, 16, cpu, kv_cache_memory_gib=0.5, tensor_parallel_size=2)
    assert rank0.kv_bytes_per_token == 2 * 30 * 2 * 64 * 4
    assert rank0.num_kv_blocks == int(0.5 * GIB) // (16 * rank0.kv_bytes_per_token)
    assert rank0.weight_bytes < plan.weight_bytes
    with pytest.raises(ValueError, match="num_kv_blocks or kv_cache_memory_gib"):
        plan_memory(smollm2, torch.float32, None, 16, cpu)


def test_gpu_plan_needs_little_host_ram():
    plan = MemoryPlan(10 * GIB, 1024, 100, 16, "cuda", 80 * GIB, 8 * GIB)
    assert plan.host_bytes == GIB  # tensors are streamed one at a time: a tenth of the weights
    assert plan.problems() == []


def test_too_little_gpu_memory_raises_with_advice(smollm2):
    # ~0.5 GiB of fp32 weights + 1 GiB of KV on a 1 GiB GPU.
    kv_blocks = GIB // (smollm2.kv_bytes_per_token(4) * 16)
    plan = MemoryPlan(
        smollm2.num_params * 4,
        smollm2.kv_bytes_per_token(4),
        kv_blocks,
        16,
        "cuda",
        gpu_memory_bytes=GIB,
        host_available_bytes=64 * GIB,
    )
    assert len(plan.problems()) == 1
    with pytest.raises(ValueError) as err:
        plan.check()
    message = str(err.value)
    assert "GPU" in message
    for word in ADVICE:
        assert word in message


def test_too_little_host_ram_raises_with_advice(smollm2):
    plan = MemoryPlan(
        smollm2.num_params * 4,
        smollm2.kv_bytes_per_token(4),
        64,
        16,
        "cpu",
        gpu_memory_bytes=None,
        host_available_bytes=256 * 1024**2,
    )
    with pytest.raises(ValueError) as err:
        plan.check()
    message = str(err.value)
    assert "host RAM" in message
    for word in ADVICE:
        assert word in message


def test_headroom_is_kept():
    """Needing 95% of the memory does not fit (10% is kept for activations and the allocator)."""
    fits = MemoryPlan(GIB // 2, 1, 0, 16, "cuda", gpu_memory_bytes=GIB, host_available_bytes=None)
    tight = MemoryPlan(int(0.95 * GIB), 1, 0, 16, "cuda", gpu_memory_bytes=GIB, host_available_bytes=None)
    fits.check()
    with pytest.raises(ValueError):
        tight.check()


def test_plan_that_fits_or_unknown_memory_passes(smollm2):
    MemoryPlan(smollm2.num_params * 4, smollm2.kv_bytes_per_token(4), 64, 16, "cpu", None, 16 * GIB).check()
    MemoryPlan(smollm2.num_params * 4, smollm2.kv_bytes_per_token(4), 64, 16, "cpu", None, None).check()


# -- the engine refuses before loading ------------------------------------------------------------


@pytest.fixture
def tiny_model_dir(tmp_path):
    """A model folder holding only a tiny Llama's config.json: enough for ``load_format='dummy'``."""
    from helpers import tiny_hf_config

    tiny_hf_config("llama").save_pretrained(tmp_path)
    return tmp_path


def _engine_config(model_dir) -> EngineConfig:
    return EngineConfig(
        model=str(model_dir), load_format="dummy", device="cpu", num_kv_blocks=64, block_size=16, max_model_len=128
    )


def test_engine_refuses_before_loading_when_host_ram_is_short(tiny_model_dir, monkeypatch):
    loads = []
    monkeypatch.setattr(model_loading, "load_model", lambda *a, **k: loads.append(a) or pytest.fail("loaded"))
    # plan_memory looks host memory up in minieng.measure.peaks when it runs.
    monkeypatch.setattr(device, "host_memory_bytes", lambda: (4096, 1024))
    with pytest.raises(ValueError) as err:
        LLMEngine(_engine_config(tiny_model_dir))
    assert "host RAM" in str(err.value) and "smaller model" in str(err.value)
    assert loads == []


def test_engine_loads_when_the_plan_fits(tiny_model_dir, monkeypatch):
    monkeypatch.setattr(device, "host_memory_bytes", lambda: (64 * GIB, 32 * GIB))
    engine = LLMEngine(_engine_config(tiny_model_dir))
    assert engine.memory_plan.host_available_bytes == 32 * GIB
    assert engine.memory_plan.kv_tokens == 64 * 16
    assert engine.memory_plan.weight_bytes == engine.model_config.num_params * 4
    assert engine.tokenizer is None
    out = engine.generate(
        [[1, 2, 3]], __import__("minieng").SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    )[0]
    assert len(out.token_ids) == 2


def test_the_device_profile_computes_every_row_of_logits_a_step_may(tiny_model_dir, monkeypatch):
    """A CUDA engine sizes its pool after a profile forward (``memory_plan.device_kv_blocks``): that
    forward computes the logits of ``logprobs.max_logits_rows`` rows (every decode's and the
    prompt rows a step may score), not one, and then samples them all as a step would
    (``sample_like_a_step``), so both are counted before the pool takes the rest. The CUDA calls
    are stubbed: only the forward's arguments and the sampler's input are read."""
    from minieng.wings.gpu_memory import kv_sizing, memory_plan
    from minieng.wings.logprobs import PROMPT_ROWS_PER_STEP

    rows_asked = []

    def forward(model, ids, logits_indices, block_size, regions=None):
        rows_asked.append((ids.numel(), logits_indices.tolist()))
        return torch.randn(logits_indices.numel(), model.config.vocab_size), 0

    sampled = []
    sample_like_a_step = memory_plan.sample_like_a_step
    monkeypatch.setattr(
        memory_plan, "sample_like_a_step", lambda logits: sampled.append(logits.shape) or sample_like_a_step(logits)
    )

    for name in ("synchronize", "empty_cache", "reset_peak_memory_stats"):
        monkeypatch.setattr(torch.cuda, name, lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a, **k: GIB)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a, **k: (70 * GIB, 80 * GIB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda *a, **k: 0)
    monkeypatch.setattr(memory_plan, "throwaway_forward", forward)
    config = replace(_engine_config(tiny_model_dir), max_num_seqs=8, max_num_batched_tokens=512)
    engine = LLMEngine(config)
    kv_sizing.device_sized_kv_blocks(engine.config, [engine.model], 256)
    ((tokens, rows),) = rows_asked
    assert tokens == 512 and rows == list(range(512 - (8 + PROMPT_ROWS_PER_STEP), 512))
    assert sampled == [(len(rows), engine.model_config.vocab_size)]  # the sampler ran on all of them
    memory_plan.profile_peak_bytes(engine.model, 100, 16, logits_rows=8 + PROMPT_ROWS_PER_STEP)
    assert rows_asked[-1] == (100, list(range(100)))  # never more rows than the step's tokens
