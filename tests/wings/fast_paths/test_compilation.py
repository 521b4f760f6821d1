"""``LLMEngine(compile=True)``: the layers' dense parts and the whole decode step compiled with
torch.compile give the eager engine's greedy tokens (float32; W8A8 on the tiny model only, see
``test_compiled_w8a8_gives_the_eager_w8a8_tokens``), compile at start-up only (no recompilation as
batches and prompts change), and fall back to eager, saying why, where no compiler is found."""

from __future__ import annotations

import pytest
import torch
from helpers import make_engine, random_prompts
from torch._dynamo.utils import counters

import minieng.wings.fast_paths.compilation as compilation
import minieng.wings.fast_paths.strategy as strategy
from minieng.wings.fast_paths.forward_paths import FastPathFailed
from minieng import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
pytestmark = pytest.mark.skipif(
    compilation.compiler_missing(torch.device("cpu")) is not None, reason="torch.compile on a CPU needs a C++ compiler"
)


@pytest.fixture(scope="module")
def compiled(tiny_llama):
    engine = make_engine(tiny_llama[1], compile=True, max_num_seqs=8, max_num_batched_tokens=64)
    assert engine.runner.fast.regions is not None and engine.runner.fast.compiled_decode is not None
    assert engine.runner.fast.compile_s > 0
    return engine


@pytest.fixture
def decode_steps(monkeypatch):
    """A list that records the batch of every step the compiled decode step runs."""
    batches, run = [], compilation.run_decode

    def counted(decode_fn, model, kv_cache, input_ids, positions, meta):
        batches.append(input_ids.shape[0])
        return run(decode_fn, model, kv_cache, input_ids, positions, meta)

    monkeypatch.setattr(strategy, "run_decode", counted)
    return batches


@pytest.mark.parametrize("lengths", [[3, 17, 40, 9, 1, 26], [30], [2], [5, 44]])
def test_compiled_greedy_tokens_equal_the_eager_engine(tiny_llama, compiled, decode_steps, lengths):
    prompts = random_prompts(lengths, tiny_llama[1].model.config.vocab_size, seed=4)
    eager = make_engine(tiny_llama[1], max_num_seqs=8, max_num_batched_tokens=64).generate(prompts, GREEDY)
    before = len(compiled.step_records)
    assert [o.token_ids for o in compiled.generate(prompts, GREEDY)] == [o.token_ids for o in eager]
    assert decode_steps  # the decodes ran the compiled decode step
    paths = {s.forward_path for s in compiled.step_records[before:]}
    assert "compiled_step" in paths and paths <= {"compiled_step", "compiled_regions"}  # prefills: the regions


@pytest.mark.skipif("fbgemm" not in torch.backends.quantized.supported_engines, reason="W8A8 on a CPU needs fbgemm")
def test_compiled_w8a8_gives_the_eager_w8a8_tokens(tiny_llama, compiled, decode_steps):
    """The W8A8 products run in the compiled step as the opaque ``minieng::fbgemm_linear``, with the
    activation scales computed in the graph (``test_decode_step`` compares the logits). Two models
    compiled in one process each run their own graphs, though no step checks the guards on their
    modules (``compilation.compile_decode_step``).

    What the equal tokens prove is that mechanics, on the tiny random model, whose activations the
    compiler's rounding (x / s computed by inductor's code, an ulp off eager's at times) pushes
    across no code boundary in this sample. On the default model it does: W8A8 turns such a
    last-bit difference into logit shifts of whole units (``tests/lab/test_quant_quality.py``), and
    compiled W8A8 wrote other greedy tokens than eager W8A8 for 38 of 40 requests of 16-55 prompt
    tokens and 24 output tokens (measured on a 2-core x86 CPU, two threads; compiled float32 wrote
    eager's tokens for all 48 requests tried). Compiled W8A8 is the same scheme, not the same tokens."""
    prompts = random_prompts([3, 17, 40, 9], tiny_llama[1].model.config.vocab_size, seed=5)
    kw = dict(max_num_seqs=8, max_num_batched_tokens=64)
    eager = make_engine(tiny_llama[1], quantization="w8a8", **kw).generate(prompts, GREEDY)
    engine = make_engine(tiny_llama[1], compile=True, quantization="w8a8", **kw)
    assert engine.runner.fast.compiled_decode is not None
    float_eager = make_engine(tiny_llama[1], **kw).generate(prompts, GREEDY)
    for _ in range(2):  # the two engines' steps interleaved
        assert [o.token_ids for o in engine.generate(prompts, GREEDY)] == [o.token_ids for o in eager]
        assert [o.token_ids for o in compiled.generate(prompts, GREEDY)] == [o.token_ids for o in float_eager]
    assert [o.token_ids for o in eager] != [o.token_ids for o in float_eager]  # the test tells them apart
    assert decode_steps


def test_nothing_recompiles_after_start_up_as_batches_and_prompts_change(tiny_llama, compiled, decode_steps):
    vocab = tiny_llama[1].model.config.vocab_size
    graphs = counters["stats"]["unique_graphs"]
    # decode batches 1, 2, 3, 5 and 8 over contexts growing across blocks, chunked prefills of many sizes
    for batch, seed in ((1, 1), (2, 2), (5, 3), (8, 4), (3, 5)):
        compiled.generate(random_prompts([7 * (i + 1) for i in range(batch)], vocab, seed=seed), GREEDY)
    assert {1, 2, 3, 5} <= set(decode_steps)
    assert counters["stats"]["unique_graphs"] == graphs


def test_without_a_compiler_the_engine_warns_and_runs_eagerly(tiny_llama, monkeypatch):
    monkeypatch.setattr(compilation, "compiler_missing", lambda device: "no C++ compiler on PATH")
    with pytest.warns(UserWarning, match="no C.. compiler on PATH; the engine runs eagerly"):
        engine = make_engine(tiny_llama[1], compile=True)
    assert (
        engine.runner.fast.regions is None
        and engine.runner.fast.compiled_decode is None
        and engine.runner.fast.compile_s is None
    )
    assert engine.runner.fast.dropped_paths == {"compile": "no C++ compiler on PATH"}
    with pytest.raises(FastPathFailed, match="no C.. compiler on PATH"):  # gpu-check's strict mode
        make_engine(tiny_llama[1], compile=True, strict_forward_paths=True)


def test_five_compiled_engines_in_one_process_each_compile_regions_of_their_own():
    """Dynamo keeps graphs per code object under a limit of 8: regions shared by every engine ran
    eagerly from the fifth (model shape, dtype, scheme) on, with only a log line. Each engine's
    regions have code objects of their own, and each compiles its graphs (two a region)."""
    from helpers import tiny_hf_config, tiny_pair

    engines = []
    for kind in ("llama", "qwen2", "mistral", "llama_tied", "llama_bias_head_dim"):
        before = counters["stats"]["unique_graphs"]
        engine = make_engine(tiny_pair(tiny_hf_config(kind), seed=0)[1], compile=True, max_num_seqs=4)
        assert engine.runner.fast.dropped_paths == {} and engine.runner.fast.regions is not None
        assert counters["stats"]["unique_graphs"] - before >= 4, kind  # its regions compiled here, not reused
        engines.append(engine)
    # distinct objects (equal code compares equal): Dynamo's cache lives on each object
    codes = {
        id(getattr(fn, "compiled", fn)._torchdynamo_orig_callable.__code__)
        for e in engines
        for fn in e.runner.fast.regions
    }
    assert len(codes) == 2 * len(engines)
