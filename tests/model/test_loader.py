"""Published shapes as model directories without weights: a config of the exact shape, the embedded
tokenizer, random weights on request, and a clear refusal to load weights that are not there."""

from __future__ import annotations

import json

import pytest
import torch

from minieng import EngineConfig, LLMEngine
from minieng.config import PUBLISHED_SHAPES, published_config
from minieng.model.loader import SHAPE_MARKER, load_config, resolve_model_dir

pytestmark = pytest.mark.real_model


@pytest.mark.parametrize("name", ["SmolLM2-1.7B", "Llama-3-8B", "Qwen2.5-7B-Instruct"])
def test_a_published_shape_resolves_to_its_config_and_the_embedded_tokenizer(name):
    path = resolve_model_dir(name)
    assert (path / SHAPE_MARKER).read_text() == name
    assert (path / "tokenizer.json").is_file() and not list(path.glob("*.safetensors"))
    config = json.loads((path / "config.json").read_text())
    for field, value in PUBLISHED_SHAPES[name].items():
        assert config[field] == value, field
    assert load_config(name)[2] == published_config(name)


def test_a_shape_without_weights_loads_only_as_dummy_and_says_where_the_real_ones_are():
    with pytest.raises(ValueError, match="load_format='dummy'.*HuggingFaceTB/SmolLM2-1.7B-Instruct"):
        LLMEngine(EngineConfig(model="SmolLM2-1.7B", device="cpu", kv_cache_memory_gib=0.1))
    engine = LLMEngine(
        EngineConfig(model="SmolLM2-135M", load_format="dummy", device="cpu", kv_cache_memory_gib=0.1, max_model_len=64)
    )
    assert engine.model_config == published_config("SmolLM2-135M") and engine.tokenizer.encode("hi")


def test_building_a_bf16_model_allocates_its_weights_in_bf16_only():
    """No float32 copy of a weight at any point of ``build_model`` in bfloat16: every storage the
    build creates (``measure.allocations.AllocationTrace``), summed, stays within 2.05 bytes a
    parameter (a float32 detour would be 6), and so does the peak of those alive at once."""
    from minieng.measure.allocations import AllocationTrace
    from minieng.model.loader import build_model

    config = published_config("SmolLM2-135M")
    with AllocationTrace("cpu") as trace:
        model = build_model(config, torch.bfloat16, torch.device("cpu"), max_position=256)
    params = sum(p.numel() for p in model.parameters())
    matrices = {p.numel() for p in model.parameters() if p.dim() == 2}
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert not [a for a in trace.allocations if a.dtype == torch.float32 and a.nbytes // 4 in matrices]
    assert trace.peak_bytes <= trace.created_bytes <= 2.05 * params
