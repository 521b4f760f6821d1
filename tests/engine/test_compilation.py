"""``LLMEngine(compile=True)``: the layers' dense parts compiled with torch.compile give the eager
engine's greedy tokens, compile at start-up only (no recompilation as batches and prompts change),
and fall back to eager, saying why, where no compiler is found."""

from __future__ import annotations

import pytest
import torch
from helpers import make_engine, random_prompts
from torch._dynamo.utils import counters

import minieng.engine.compilation as compilation
from minieng import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
pytestmark = pytest.mark.skipif(
    compilation.compiler_missing(torch.device("cpu")) is not None, reason="torch.compile on a CPU needs a C++ compiler"
)


@pytest.fixture(scope="module")
def compiled(tiny_llama):
    engine = make_engine(tiny_llama[1], compile=True, max_num_seqs=8, max_num_batched_tokens=64)
    assert engine.runner.regions is not None and engine.runner.compile_s > 0
    return engine


def test_compiled_greedy_tokens_equal_the_eager_engine(tiny_llama, compiled):
    prompts = random_prompts([3, 17, 40, 9, 1, 26], tiny_llama[1].model.config.vocab_size, seed=4)
    eager = make_engine(tiny_llama[1], max_num_seqs=8, max_num_batched_tokens=64).generate(prompts, GREEDY)
    assert [o.token_ids for o in compiled.generate(prompts, GREEDY)] == [o.token_ids for o in eager]


def test_nothing_recompiles_after_start_up_as_batches_and_prompts_change(tiny_llama, compiled):
    vocab = tiny_llama[1].model.config.vocab_size
    compiled.generate(random_prompts([5], vocab, seed=0), GREEDY)
    graphs = counters["stats"]["unique_graphs"]
    for batch, seed in ((1, 1), (2, 2), (5, 3), (8, 4), (3, 5)):  # decode batches 1..8, chunked prefills of many sizes
        compiled.generate(random_prompts([7 * (i + 1) for i in range(batch)], vocab, seed=seed), GREEDY)
    assert counters["stats"]["unique_graphs"] == graphs


def test_without_a_compiler_the_engine_warns_and_runs_eagerly(tiny_llama, monkeypatch):
    monkeypatch.setattr(compilation, "compiler_missing", lambda device: "no C++ compiler on PATH")
    with pytest.warns(UserWarning, match="no C.. compiler on PATH; the engine runs eagerly"):
        engine = make_engine(tiny_llama[1], compile=True)
    assert engine.runner.regions is None and engine.runner.compile_s is None
