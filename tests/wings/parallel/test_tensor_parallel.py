"""Tensor parallelism (``tensor_parallel_size=2``): two processes over gloo on this CPU give the
greedy tokens of one process, under batching, chunked prefill, prefix hits, preemption and prompt
lookup speculation; construction refuses what it cannot split, naming the numbers; and no worker
outlives its engine, even one that died.

The default model has 9 query heads and 3 KV heads: rank 0 holds two KV heads, rank 1 one
(``tensor_parallel.split``), so the uneven split is what these tests run. The two ranks add partial
sums in another order than one process does, so fp32 may differ in the last bits: a divergence is
accepted only at an exact near-tie of transformers' logits (``assert_same_or_near_tie``).
"""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch
from helpers import REAL_TEXTS, chat_ids, check_all, check_budget, hf_next_logits, num_split_prompts

from minieng import EngineConfig, LLMEngine, SamplingParams
from minieng.config import published_config
from minieng.wings.parallel import workers as workers_module
from minieng.wings.parallel.workers import WorkerError
from minieng.wings.parallel.tensor_parallel import TensorParallel, checkpoint_slice, shard_config, split

GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
CHOSEN = [0, 4, 6, 8, 11, 14]  # short and long prompts


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _wait_gone(pids: list[int], timeout_s: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(_gone(p) for p in pids):
            return True
        time.sleep(0.1)
    return False


# -- the split itself (no process started) ----------------------------------------------------------


@pytest.mark.parametrize("total,size", [(3, 2), (9, 2), (1536, 2), (3, 3), (7, 4), (8, 8)])
def test_split_covers_everything_once_as_evenly_as_whole_items_allow(total, size):
    parts = [split(total, size, r) for r in range(size)]
    assert parts[0][0] == 0 and parts[-1][1] == total
    assert all(a[1] == b[0] for a, b in zip(parts, parts[1:])), "shares must be contiguous and disjoint"
    sizes = [stop - start for start, stop in parts]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_the_default_shape_splits_by_kv_head_groups():
    config = published_config("SmolLM2-135M")  # 9 heads, 3 KV heads, 1,536 MLP columns
    ranks = [shard_config(config, 2, r) for r in range(2)]
    assert [(c.num_attention_heads, c.num_key_value_heads) for c in ranks] == [(6, 2), (3, 1)]
    assert [c.intermediate_size for c in ranks] == [768, 768]
    assert sum(c.num_attention_heads for c in ranks) == config.num_attention_heads


@pytest.mark.parametrize("size", [2, 3])
def test_checkpoint_slices_tile_every_split_tensor(size):
    config = published_config("SmolLM2-135M")
    d = config.head_dim
    full = {
        "model.layers.0.self_attn.q_proj.weight": (0, config.num_attention_heads * d),
        "model.layers.0.self_attn.k_proj.weight": (0, config.num_key_value_heads * d),
        "model.layers.0.self_attn.o_proj.weight": (1, config.num_attention_heads * d),
        "model.layers.0.mlp.up_proj.weight": (0, config.intermediate_size),
        "model.layers.0.mlp.down_proj.weight": (1, config.intermediate_size),
        "model.embed_tokens.weight": (0, config.vocab_size),
    }
    for name, (dim, length) in full.items():
        parts = [checkpoint_slice(name, config, TensorParallel(r, size)) for r in range(size)]
        assert {p[0] for p in parts} == {dim}, name
        assert parts[0][1] == 0 and parts[-1][2] == length, name
        assert all(a[2] == b[1] for a, b in zip(parts, parts[1:])), name
    assert checkpoint_slice("model.layers.0.input_layernorm.weight", config, TensorParallel(1, size)) is None
    assert checkpoint_slice("model.layers.0.self_attn.o_proj.bias", config, TensorParallel(1, size)) is None


# -- construction errors (refused before any process starts) ----------------------------------------


@pytest.mark.real_model
@pytest.mark.parametrize(
    "overrides,message",
    [
        (dict(tensor_parallel_size=4), "num_key_value_heads=3"),
        (dict(tensor_parallel_size=2, compile=True), "compile=True"),
        (dict(tensor_parallel_size=2, quantization="int8"), "quantization='int8'"),
        (
            dict(tensor_parallel_size=2, speculative_method="draft", num_speculative_tokens=2),
            "speculative_method='draft'",
        ),
    ],
)
def test_what_cannot_be_split_is_refused_naming_it(overrides, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        LLMEngine(device="cpu", **overrides)


@pytest.mark.real_model
def test_more_ranks_than_cores_is_refused(monkeypatch):
    monkeypatch.setattr(workers_module, "usable_cores", lambda: 1)
    with pytest.raises(ValueError, match="tensor_parallel_size=2 needs a CPU core per rank; this machine has 1"):
        LLMEngine(device="cpu", tensor_parallel_size=2)


@pytest.mark.real_model
def test_a_loaded_model_cannot_be_split(default_model):
    with pytest.raises(ValueError, match="already loaded model"):
        LLMEngine(EngineConfig(device="cpu", tensor_parallel_size=2), loaded=default_model)


def test_tensor_parallel_size_must_be_positive():
    with pytest.raises(ValueError, match="tensor_parallel_size=0 is invalid"):
        EngineConfig(tensor_parallel_size=0)


# -- two ranks over gloo, against one ---------------------------------------------------------------


@pytest.fixture(scope="module")
def reference(default_model, hf_default):
    """Prompts, their p = 1 greedy outputs alone, and transformers' next-token logits."""
    prompts = [chat_ids(default_model.tokenizer, t) for t in REAL_TEXTS]
    engine = LLMEngine(EngineConfig(device="cpu", max_model_len=512, num_kv_blocks=64), loaded=default_model)
    alone = {i: engine.generate([prompts[i]], GREEDY)[0].token_ids for i in CHOSEN}
    return prompts, alone, hf_next_logits(hf_default)


@pytest.fixture(scope="module")
def tp2():
    """One p = 2 engine for the module (each start spawns a process and loads a share), built with
    prompt lookup (``_run`` turns it off unless a test asks for it); its workers must be gone once
    it closes."""
    threads = torch.get_num_threads()
    engine = LLMEngine(
        device="cpu",
        tensor_parallel_size=2,
        max_model_len=512,
        num_kv_blocks=64,
        speculative_method="ngram",
        num_speculative_tokens=3,
    )
    pids = [p.pid for p in engine.workers.processes]
    assert not any(_gone(p) for p in pids)
    assert torch.get_num_threads() == max(1, threads // 2), "rank 0 keeps its share of the cores"
    yield engine
    engine.close()
    assert _wait_gone(pids), "a worker outlived its engine"
    assert torch.get_num_threads() == threads, "rank 0's threads were not given back"


def _run(engine, prompts, reference, what, num_speculative_tokens=0):
    chosen_prompts, alone, next_logits = reference
    engine.step_records.clear()
    k = min(num_speculative_tokens, engine.config.num_speculative_tokens)
    with engine.reconfigured(num_speculative_tokens=k):
        outputs = engine.generate([chosen_prompts[i] for i in prompts], GREEDY)
    check_all([chosen_prompts[i] for i in prompts], [alone[i] for i in prompts], outputs, next_logits, what)
    return outputs


@pytest.mark.real_model
def test_two_ranks_give_one_rank_s_tokens_in_a_batch(tp2, reference):
    assert tp2.model.local_config.num_key_value_heads == 2 and tp2.kv_cache.kv.shape[3] == 4
    _run(tp2, CHOSEN, reference, "p=2, batch of 6")
    assert max(len(r.chunks) for r in tp2.step_records) == len(CHOSEN), "the requests never ran together"


@pytest.mark.real_model
def test_two_ranks_with_chunked_prefill_and_prefix_hits(tp2, reference):
    with tp2.reconfigured(max_num_batched_tokens=16, max_num_seqs=16):
        _run(tp2, CHOSEN, reference, "p=2, budget 16")
        check_budget(tp2)
        assert num_split_prompts(tp2) > 0, "no prompt was split into chunks"
    outputs = _run(tp2, CHOSEN, reference, "p=2, the same prompts again")
    assert any(o.num_cached_tokens for o in outputs), "no prefix hit on the second run"


@pytest.mark.real_model
def test_two_ranks_with_prompt_lookup_speculation(tp2, reference):
    _run(tp2, CHOSEN, reference, "p=2, prompt lookup k=3", num_speculative_tokens=3)
    assert tp2.spec_records, "no draft was verified"


@pytest.mark.real_model
def test_two_ranks_preempt_and_recompute(reference):
    with LLMEngine(device="cpu", tensor_parallel_size=2, max_model_len=128, num_kv_blocks=8) as engine:
        prompts = [i for i in CHOSEN if len(reference[0][i]) + GREEDY.max_tokens <= 128]
        _run(engine, prompts, reference, "p=2, preemption")
        assert sum(r.num_preempted for r in engine.step_records) > 0, "the small pool never preempted"
        assert engine.block_manager.num_free_blocks == 8


@pytest.mark.real_model
def test_a_dead_worker_is_an_error_not_a_hang(reference):
    engine = LLMEngine(device="cpu", tensor_parallel_size=2, max_model_len=256, num_kv_blocks=32)
    pid = engine.workers.processes[0].pid
    os.kill(pid, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(WorkerError, match=f"worker 1 \\(pid {pid}\\) exited with code -9"):
        engine.generate([reference[0][0]], GREEDY)
    assert time.monotonic() - start < 60
    with pytest.raises(WorkerError, match="closed"):
        engine.generate([reference[0][0]], GREEDY)
    engine.close()
    assert _wait_gone([pid])


@pytest.mark.real_model
def test_the_all_reduce_is_timed_on_the_engine_s_own_group(tp2):
    sizes = [4, 64 * 1024]
    samples = tp2.workers.time_all_reduce(sizes, 5, torch.float32)
    assert [len(s) for s in samples] == [5, 5] and all(0 < t < 5 for s in samples for t in s)
    tp = tp2.model.tp
    tp.reset()
    tp2.generate([[1, 2, 3]], SamplingParams(max_tokens=2, ignore_eos=True))
    layers = tp2.model_config.num_hidden_layers
    # Two steps (the prompt, one decode): each 2 all-reduces per layer, the embedding's and the logits' gather.
    assert tp.num_collectives == 2 * (2 * layers + 2)
    assert tp.comm_s > 0


@pytest.mark.real_model
def test_kv_hand_off_is_refused_where_other_ranks_hold_kv_heads(tp2):
    from minieng.wings.parallel.kv_transfer import export_prefilled

    with pytest.raises(ValueError, match="tensor_parallel_size=1"):
        export_prefilled(tp2, "any")


SCRIPT_LEAVING_AN_ENGINE_OPEN = """
from minieng import LLMEngine

if __name__ == "__main__":
    engine = LLMEngine(device="cpu", tensor_parallel_size=2, max_model_len=64, num_kv_blocks=8)
    print(engine.workers.processes[0].pid, flush=True)
"""


@pytest.mark.real_model
def test_workers_exit_with_the_interpreter_even_when_the_engine_is_never_closed(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "open_engine.py"
    script.write_text(SCRIPT_LEAVING_AN_ENGINE_OPEN)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert _wait_gone([int(done.stdout.split()[-1])]), "the worker outlived the interpreter"


# -- shapes the default model does not have: biases, an untied head, a vocabulary p does not divide --


@pytest.fixture(scope="module", params=["llama_bias_head_dim", "qwen2", "llama_tied"])
def odd_checkpoint(request, tmp_path_factory):
    """A tiny saved checkpoint with 6 query and 3 KV heads (split 2:1), a vocabulary of 301 (the
    last shard padded), and the variant's biases or tied head; with transformers' model for logits."""
    from helpers import tiny_hf_config, tiny_hf_model

    config = tiny_hf_config(request.param)
    config.vocab_size, config.num_attention_heads, config.num_key_value_heads = 301, 6, 3
    config.hidden_size = 96  # a multiple of the heads (llama_bias_head_dim keeps its head_dim of 32)
    hf = tiny_hf_model(config, seed=3)
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path)
    return path, hf


def test_two_ranks_give_one_rank_s_tokens_on_biased_untied_and_odd_vocabulary_models(odd_checkpoint):
    from helpers import assert_same_or_near_tie, random_prompts

    path, hf = odd_checkpoint
    prompts = random_prompts([5, 17, 2], 301, seed=5)
    fields = dict(model=str(path), device="cpu", block_size=4, num_kv_blocks=64, max_model_len=64)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    one = [o.token_ids for o in LLMEngine(**fields).generate(prompts, params)]
    with LLMEngine(tensor_parallel_size=2, **fields) as engine:
        head, embed = engine.model.lm_head, engine.model.embed_tokens  # 301 tokens: rank 0 holds 151, padded alike
        assert head.rows == 151 and embed.weight.shape[0] == 151 and engine.model.local_config.num_key_value_heads == 2
        two = [o.token_ids for o in engine.generate(prompts, params)]
    for prompt, a, b in zip(prompts, one, two):
        assert_same_or_near_tie(a, b, prompt, hf_next_logits(hf), what=f"{path.name} p=2")


def test_an_engine_that_fails_after_its_workers_started_leaves_none_behind(odd_checkpoint):
    import multiprocessing

    path, _ = odd_checkpoint
    threads = torch.get_num_threads()
    before = {p.pid for p in multiprocessing.active_children()}  # another test's engine may be open
    with pytest.raises(ValueError, match="fewer than one sequence of max_model_len=64"):
        # 2 blocks of 4 tokens cannot hold the 64 asked for: refused once the workers have loaded.
        LLMEngine(
            model=str(path), device="cpu", tensor_parallel_size=2, block_size=4, num_kv_blocks=2, max_model_len=64
        )
    deadline = time.monotonic() + 15
    while any(p.name.startswith("minieng-tp") and p.pid not in before for p in multiprocessing.active_children()):
        assert time.monotonic() < deadline, "a worker outlived the engine that failed to build"
        time.sleep(0.1)
    assert torch.get_num_threads() == threads


SCRIPT_WITHOUT_ITS_MAIN_GUARD = """
from minieng import LLMEngine

engine = LLMEngine(device="cpu", tensor_parallel_size=2, max_model_len=64, num_kv_blocks=8)
"""


@pytest.mark.real_model
def test_a_script_without_its_main_guard_is_told_so_at_once(tmp_path):
    """The spawned worker imports the script again, starts an engine of its own and dies: rank 0
    must say so as soon as the worker exits, not after the group's timeout."""
    import subprocess
    import sys

    from minieng.wings.parallel.workers import COLLECTIVE_TIMEOUT_S

    script = tmp_path / "no_guard.py"
    script.write_text(SCRIPT_WITHOUT_ITS_MAIN_GUARD)
    start = time.monotonic()
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert "exited with code 1" in done.stderr and 'if __name__ == "__main__":' in done.stderr
    assert time.monotonic() - start < COLLECTIVE_TIMEOUT_S
