"""How a step's forward ran, and a fast path that fails to build: named, warned, kept, or raised
in strict mode, never only slower steps (``wings/fast_paths/forward_paths.py``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from helpers import make_engine, random_prompts

from minieng import SamplingParams
from minieng.wings.fast_paths import cuda_graph
from minieng.wings.fast_paths.cuda_graph import DecodeGraphs, capture_decode_graphs
from minieng.wings.fast_paths.forward_paths import FastPathFailed, fall_back


class CompilationError(Exception):
    """Triton's compile errors are no ``RuntimeError``: the capture's handler must still see them."""


def test_a_capture_that_fails_with_any_error_is_a_fast_path_failure(monkeypatch, tiny_llama):
    def refuse(*args, **kwargs):
        raise CompilationError("at 12:8: out of resources: shared memory")

    monkeypatch.setattr(cuda_graph, "DecodeGraphs", refuse)
    on_cuda = SimpleNamespace(k=SimpleNamespace(device=torch.device("cuda", 0)))
    engine = make_engine(tiny_llama[1])
    with pytest.raises(FastPathFailed, match="CUDA graph capture failed .CompilationError: at 12:8") as failed:
        capture_decode_graphs(engine.config, engine.model, on_cuda, 64, None)
    assert failed.value.path == "cuda_graph" and "out of resources" in failed.value.reason


def test_fall_back_warns_keeps_the_reason_or_raises_when_strict():
    def broken():
        raise FastPathFailed("cuda_graph", "OutOfMemoryError: 2 GiB", "CUDA graph capture failed (...)")

    dropped: dict[str, str] = {}
    with pytest.warns(UserWarning, match="CUDA graph capture failed"):
        assert fall_back(broken, None, False, dropped) is None
    assert dropped == {"cuda_graph": "OutOfMemoryError: 2 GiB"}
    with pytest.raises(FastPathFailed):
        fall_back(broken, None, True, {})
    assert fall_back(lambda: "graphs", None, True, {}) == "graphs"


def test_every_step_records_how_its_forward_ran(tiny_llama):
    """Eager prefills and decodes; decodes through the graphs' buffers (run eagerly on a CPU) once
    a ``DecodeGraphs`` is there, and a batch too wide for its buckets eagerly again."""
    engine = make_engine(tiny_llama[1], max_num_seqs=8)
    prompts = random_prompts([5, 9], tiny_llama[1].model.config.vocab_size, seed=1)
    engine.generate(prompts, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    assert {s.forward_path for s in engine.step_records} == {"eager"}
    assert not any(s.forward_path == "cuda_graph" for s in engine.step_records)
    engine.runner.fast.graphs = DecodeGraphs(engine.model, engine.runner.kv_cache, 2, 64, 1 << 20, capture=False)
    before = len(engine.step_records)
    engine.generate(prompts, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    decodes = [s for s in engine.step_records[before:] if s.num_prefill_tokens == 0]
    assert decodes and all(s.forward_path == "cuda_graph" for s in decodes)
    before = len(engine.step_records)
    wide = random_prompts([4, 6, 3], tiny_llama[1].model.config.vocab_size, seed=2)  # 3 > the buckets' 2
    engine.generate(wide, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    three = [s for s in engine.step_records[before:] if s.num_decode_seqs == 3 and s.num_prefill_tokens == 0]
    assert three and all(s.forward_path == "eager" for s in three)
    assert engine.runner.fast.dropped_paths == {}
