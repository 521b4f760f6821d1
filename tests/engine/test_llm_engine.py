"""The engine's public contract: input validation, stopping, sampling, streaming, steps, timestamps.

Most tests run on a tiny random Llama (token-id prompts, no tokenizer) for speed; those that
need text (stop strings, streaming, the detokenizer) use the embedded default model.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from helpers import chat_ids, make_engine, random_prompts
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minieng import EngineConfig, LLMEngine, SamplingParams
from minieng.core.outputs import IncrementalDetokenizer
from minieng.core.sampling import KeyedRandom, probabilities, race, sample
from minieng.model.loader import LoadedModel

VOCAB = 300  # the tiny Llama's


def greedy(n: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, **kw)


# -- bad input is a ValueError naming the field and the value -----------------------------------------


@pytest.mark.parametrize(
    "kwargs,expected",
    [
        (dict(max_tokens=0), "max_tokens=0"),
        (dict(max_tokens=-3), "max_tokens=-3"),
        (dict(temperature=-0.5), "temperature=-0.5"),
        (dict(top_p=0), "top_p=0"),
        (dict(top_p=1.5), "top_p=1.5"),
        (dict(top_k=-1), "top_k=-1"),
        (dict(temperature=float("nan")), "temperature=nan"),
        (dict(stop=["ok", ""]), "stop="),
        # Every non-finite value, each naming its field (inf passes ">= 0"; 1e400 parses as inf).
        (dict(temperature=float("inf")), "temperature=inf.*finite"),
        (dict(temperature=float("1e400")), "temperature=inf.*finite"),
        (dict(top_p=float("nan")), "top_p=nan.*finite"),
        (dict(top_p=float("-inf")), "top_p=-inf.*finite"),
        (dict(top_k=float("inf")), "top_k=inf.*finite"),
        (dict(max_tokens=float("inf")), "max_tokens=inf.*finite"),
        (dict(seed=float("nan")), "seed=nan.*finite"),
    ],
)
def test_bad_sampling_params(kwargs, expected):
    with pytest.raises(ValueError, match=expected.replace("[", r"\[")):
        SamplingParams(**kwargs)


@pytest.mark.parametrize(
    "kwargs,expected",
    [
        (dict(max_num_seqs=8, max_num_batched_tokens=4), "max_num_batched_tokens=4"),
        (dict(block_size=0), "block_size=0"),
        (dict(num_kv_blocks=0), "num_kv_blocks=0"),
        (dict(kv_cache_memory_gib=0), "kv_cache_memory_gib=0"),
        (dict(max_model_len=0), "max_model_len=0"),
        (dict(dtype="int8"), "dtype='int8'"),
        (dict(device="tpu"), "device='tpu'"),
        (dict(load_format="npz"), "load_format='npz'"),
    ],
)
def test_bad_engine_config(kwargs, expected):
    with pytest.raises(ValueError, match=expected):
        EngineConfig(**kwargs)


def test_empty_prompt(tiny_engine):
    with pytest.raises(ValueError, match=r"prompt.*\b0 tokens"):
        tiny_engine().add_request([])


@pytest.mark.real_model
def test_empty_text_prompt(real_engine):
    with pytest.raises(ValueError, match=r"prompt.*\b0 tokens"):
        real_engine().add_request("")


@pytest.mark.real_model
def test_a_lone_surrogate_is_a_value_error(real_engine):
    """Text with a lone surrogate (what JSON's "\\ud800" decodes to) has no UTF-8 form: the
    tokenizer raised TypeError; add_request promises ValueError, and queues nothing."""
    engine = real_engine()
    for call in (engine.add_request, engine.generate, engine.stream, engine.check_request):
        with pytest.raises(ValueError, match=r"lone surrogate \(U\+D800 at character 3\)"):
            call("hi \ud800 there")
    assert engine.requests == {} and not engine.has_unfinished_requests()
    assert engine.generate("hi \U0001f600 there", greedy(2))[0].finished, "a proper astral character is fine"
    with pytest.raises(ValueError, match=r"message 1's content holds a lone surrogate"):  # the chat path too
        engine.chat_prompt([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi \ud800"}])


def test_prompt_longer_than_max_model_len(tiny_engine):
    engine = tiny_engine(max_model_len=32)
    for n in (32, 40):
        with pytest.raises(ValueError, match=rf"{n} tokens.*max_model_len=32"):
            engine.add_request([1] * n)
    # The longest accepted prompt still runs: one token, stopped by the length limit.
    out = engine.generate([[1] * 31], greedy(10))[0]
    assert len(out.token_ids) == 1 and out.finish_reason == "length"


def test_prompt_ids_outside_the_vocabulary(tiny_engine):
    engine = tiny_engine()
    for bad in ([1, VOCAB], [-1, 2]):
        with pytest.raises(ValueError, match=rf"\[0, {VOCAB}\)"):
            engine.add_request(bad)


def test_duplicate_request_id(tiny_engine):
    engine = tiny_engine()
    engine.add_request([1, 2], request_id="x")
    with pytest.raises(ValueError, match="request_id='x'"):
        engine.add_request([3], request_id="x")


def test_kv_pool_too_small_for_one_sequence(tiny_llama):
    loaded = tiny_llama[1]
    with pytest.raises(ValueError, match=r"max_model_len=64.*num_kv_blocks|num_kv_blocks.*max_model_len=64"):
        make_engine(loaded, block_size=16, num_kv_blocks=3, max_model_len=64)
    with pytest.raises(ValueError, match="kv_cache_memory_gib"):
        LLMEngine(EngineConfig(device="cpu", max_model_len=256, kv_cache_memory_gib=1e-6), loaded=loaded)
    make_engine(loaded, block_size=16, num_kv_blocks=4, max_model_len=64)  # exactly one sequence: accepted


def test_max_model_len_beyond_the_model(tiny_llama):
    with pytest.raises(ValueError, match="max_model_len=1000"):
        make_engine(tiny_llama[1], max_model_len=1000)


def test_generate_with_mismatched_params(tiny_engine):
    with pytest.raises(ValueError, match="2 SamplingParams for 3 prompts"):
        tiny_engine().generate([[1], [2], [3]], [greedy(2), greedy(2)])


def engine_state(engine: LLMEngine) -> tuple:
    """What a failed call must leave unchanged: requests, queues, blocks."""
    bm = engine.block_manager
    return (
        list(engine.requests),
        list(engine.scheduler.waiting),
        list(engine.scheduler.running),
        engine.has_unfinished_requests(),
        bm.num_free_blocks,
        len(engine.step_records),
    )


@pytest.mark.parametrize(
    "bad",
    [
        ([[1, 2, 3], []], None, r"prompt 1: prompt is empty"),
        ([[1, 2, 3], [4, 5], [1, VOCAB]], None, r"prompt 2: .*\[0, 300\)"),
        ([[1, 2, 3], [4] * 40], None, r"prompt 1: .*max_model_len=32"),
        ([[1, 2, 3], [4, 5]], [greedy(2), "greedy"], r"prompt 1: params must be a SamplingParams"),
    ],
)
def test_a_failed_generate_queues_nothing(tiny_engine, bad):
    """A batch with one bad prompt raises before any prompt is queued: the good ones must not run
    later among another call's requests (issue 8)."""
    prompts, params, message = bad
    engine = tiny_engine(max_model_len=32)
    before = engine_state(engine)
    with pytest.raises(ValueError, match=message):
        engine.generate(prompts, params or greedy(2))
    assert engine_state(engine) == before and not engine.has_unfinished_requests()
    outs = engine.generate([[7, 8, 9]], greedy(3))
    assert [o.prompt_token_ids for o in outs] == [[7, 8, 9]] and list(engine.requests) == ["0"]
    assert engine_state(engine)[3:5] == (False, engine.block_manager.num_blocks)


def test_stream_refuses_bad_input_at_the_call(tiny_engine):
    engine = tiny_engine()
    engine.add_request([1, 2], request_id="taken")
    before = engine_state(engine)
    with pytest.raises(ValueError, match="0 tokens"):
        engine.stream([], greedy(2))  # no next(): the call itself raises
    with pytest.raises(ValueError, match="request_id='taken'"):
        engine.stream([3], greedy(2), request_id="taken")
    assert engine_state(engine) == before
    deltas = engine.stream([3, 4], greedy(2), request_id="s")
    assert "s" in engine.requests, "stream queues its request at the call"
    assert list(deltas) == [] and engine.output("s").finished  # no tokenizer: no text, but it ran


def test_automatic_ids_skip_ids_in_use(tiny_engine):
    engine = tiny_engine()
    engine.add_request([1], request_id="0")
    assert engine.add_request([2]) == "1"
    assert engine.generate([[3]], greedy(1))[0].request_id == "2"


# -- chat prompts ------------------------------------------------------------------------------------


def test_a_chat_prompt_starts_with_one_bos(tiny_llama):
    """A tokenizer that adds BOS (as Llama 3's) and a chat template that writes it too: rendering the
    template to text and encoding that text gives [bos, bos, ...]; ``chat_prompt`` gives one."""
    from helpers import BOS_ID, bos_tokenizer

    tok = bos_tokenizer()
    loaded = tiny_llama[1]
    engine = make_engine(LoadedModel(loaded.model, tok, loaded.hf_config, {2}, None))
    messages = [{"role": "user", "content": "w7 w8 w9"}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert engine.tokenize(text)[:2] == [BOS_ID, BOS_ID], "the test tokenizer should show the double BOS"
    ids = engine.chat_prompt(messages)
    assert ids[0] == BOS_ID and ids[1] != BOS_ID and ids.count(BOS_ID) == 1
    assert ids == tok.encode(text, add_special_tokens=False) == engine.chat_prompt("w7 w8 w9")
    out = engine.generate([ids], greedy(3))[0]
    assert out.prompt_token_ids == ids and len(out.token_ids) == 3
    for empty in ("", "  \n"):
        with pytest.raises(ValueError, match="prompt is empty"):
            engine.chat_prompt(empty)
    no_tokenizer = make_engine(loaded)
    with pytest.raises(ValueError, match="no chat template"):
        no_tokenizer.chat_prompt("w7")


# -- accepted input never crashes later ---------------------------------------------------------------


def test_tiny_positive_temperature_does_not_crash(tiny_engine):
    """SamplingParams accepts any temperature >= 0; a tiny positive one must behave (as greedy)."""
    engine = tiny_engine()
    prompt = random_prompts([9], VOCAB, seed=1)[0]
    ref = engine.generate([prompt], greedy(6))[0].token_ids
    out = engine.generate([prompt], SamplingParams(temperature=1e-39, max_tokens=6, ignore_eos=True, seed=0))[0]
    assert out.token_ids == ref


sampling_params = st.builds(
    SamplingParams,
    temperature=st.one_of(st.just(0.0), st.floats(1e-3, 5.0)),
    top_k=st.integers(0, VOCAB + 10),
    top_p=st.floats(1e-6, 1.0),
    seed=st.one_of(st.none(), st.integers(0, 2**32)),
    max_tokens=st.integers(1, 6),
    stop_token_ids=st.lists(st.integers(0, VOCAB - 1), max_size=3),
    ignore_eos=st.booleans(),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    requests=st.lists(
        st.tuples(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=20), sampling_params), min_size=1, max_size=4
    ),
    budget=st.integers(4, 40),
    chunked=st.booleans(),
)
def test_accepted_input_runs_to_completion(tiny_engine, requests, budget, chunked):
    engine = tiny_engine(
        max_num_seqs=4, max_num_batched_tokens=budget, enable_chunked_prefill=chunked, max_model_len=24, num_kv_blocks=8
    )
    outputs = engine.generate([p for p, _ in requests], [sp for _, sp in requests])
    for (prompt, params), out in zip(requests, outputs):
        assert out.finished and out.finish_reason in ("stop", "length")
        assert 1 <= len(out.token_ids) <= min(params.max_tokens, 24 - len(prompt))
        assert all(0 <= t < VOCAB for t in out.token_ids)
        if out.finish_reason == "stop":
            assert out.token_ids[-1] in params.stop_token_ids
    assert engine.block_manager.num_free_blocks == 8


# -- stopping ----------------------------------------------------------------------------------------


def test_max_tokens_and_max_model_len_stop(tiny_engine):
    engine = tiny_engine(max_model_len=32)
    a, b = random_prompts([5, 28], VOCAB, seed=2)
    out_a, out_b = engine.generate([a, b], greedy(7))
    assert len(out_a.token_ids) == 7 and out_a.finish_reason == "length"
    assert len(out_b.token_ids) == 32 - 28 and out_b.finish_reason == "length"


def test_stop_token_ids(tiny_engine):
    engine = tiny_engine()
    prompt = random_prompts([11], VOCAB, seed=3)[0]
    ref = engine.generate([prompt], greedy(20))[0].token_ids
    stop = ref[6]
    j = ref.index(stop)
    for ignore_eos in (True, False):  # ignore_eos concerns EOS only, not stop_token_ids
        out = engine.generate(
            [prompt], SamplingParams(temperature=0, max_tokens=20, stop_token_ids=[stop], ignore_eos=ignore_eos)
        )[0]
        assert out.token_ids == ref[: j + 1] and out.finish_reason == "stop"


def test_eos_and_ignore_eos(tiny_llama):
    """A model whose EOS is a token greedy decoding reaches: it stops there unless ignore_eos."""
    hf, loaded = tiny_llama
    prompt = random_prompts([7], VOCAB, seed=4)[0]
    ref = make_engine(loaded).generate([prompt], greedy(20))[0].token_ids
    eos = ref[5]
    j = ref.index(eos)
    with_eos = LoadedModel(loaded.model, None, loaded.hf_config, {eos}, None)
    engine = make_engine(with_eos)
    out = engine.generate([prompt], SamplingParams(temperature=0, max_tokens=20))[0]
    assert out.token_ids == ref[: j + 1] and out.finish_reason == "stop"
    out = engine.generate([prompt], greedy(20))[0]
    assert out.token_ids == ref and out.finish_reason == "length"


@pytest.mark.real_model
def test_real_model_stops_at_eos(default_model, real_engine):
    engine = real_engine()
    prompt = chat_ids(default_model.tokenizer, "Say only the word yes.")
    out = engine.generate([prompt], SamplingParams(temperature=0, max_tokens=64))[0]
    eos = default_model.eos_token_ids
    assert out.finish_reason == "stop" and out.token_ids[-1] in eos, "a one-word answer should end with EOS"
    assert not set(out.token_ids[:-1]) & eos
    assert out.text == default_model.tokenizer.decode(out.token_ids, skip_special_tokens=True)
    n = len(out.token_ids)
    longer = engine.generate([prompt], greedy(n + 4))[0]
    assert longer.token_ids[:n] == out.token_ids and len(longer.token_ids) == n + 4


@pytest.fixture(scope="module")
def story(default_model):
    """A greedy continuation, its text, and the character offset where each token's text ends."""
    from minieng import EngineConfig as Cfg

    engine = LLMEngine(Cfg(device="cpu", max_model_len=512, num_kv_blocks=32), loaded=default_model)
    prompt = chat_ids(default_model.tokenizer, "Write a short story about a robot who learns to paint.")
    out = engine.generate([prompt], greedy(48))[0]
    tok = default_model.tokenizer
    ends = [len(tok.decode(out.token_ids[:k], skip_special_tokens=True)) for k in range(1, len(out.token_ids) + 1)]
    return prompt, out, ends


def pick_stop_string(text: str, ends: list[int]) -> tuple[str, int]:
    """A 4-character string straddling a token boundary, occurring first right there."""
    for b in ends[len(ends) // 3 :]:
        s = text[b - 2 : b + 2]
        if len(s) == 4 and text.find(s) == b - 2 and s.strip() == s and "\ufffd" not in s:
            return s, b - 2
    raise AssertionError("no usable token boundary in the reference text")


@pytest.mark.real_model
def test_stop_strings(real_engine, story):
    prompt, ref, ends = story
    stop, at = pick_stop_string(ref.text, ends)
    expected = ref.text[:at]
    engine = real_engine()
    out = engine.generate([prompt], greedy(48, stop=[stop]))[0]
    assert out.finish_reason == "stop"
    assert out.text == expected
    assert ref.token_ids[: len(out.token_ids)] == out.token_ids and len(out.token_ids) < len(ref.token_ids)
    deltas = list(engine.stream(prompt, greedy(48, stop=["zq#never#qz", stop])))
    assert "".join(deltas) == expected
    assert not any(stop in d for d in deltas)
    assert engine.output(list(engine.requests)[-1]).finish_reason == "stop"


# -- sampling ----------------------------------------------------------------------------------------


def test_same_seed_same_tokens_different_seeds_differ(tiny_engine):
    prompt = random_prompts([8], VOCAB, seed=5)[0]

    def run(seed, engine=None):
        engine = engine or tiny_engine()
        return engine.generate([prompt], SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True, seed=seed))[
            0
        ].token_ids

    assert run(123) == run(123)
    # The tiny model's distributions are broad at temperature 1: 16 tokens of two different seeds
    # coincide with probability far below 1e-9.
    outs = {tuple(run(seed)) for seed in range(5)}
    assert len(outs) == 5


def test_seeded_request_is_independent_of_its_batch(tiny_engine):
    prompts = random_prompts([8, 3, 19, 12], VOCAB, seed=6)
    sampled = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=12, ignore_eos=True, seed=7)
    alone = tiny_engine().generate([prompts[0]], sampled)[0].token_ids
    mixed = tiny_engine(max_num_batched_tokens=16, max_num_seqs=4).generate(
        prompts, [sampled, greedy(12), SamplingParams(temperature=1.3, max_tokens=9, seed=1), greedy(5)]
    )
    assert mixed[0].token_ids == alone
    assert mixed[1].token_ids == tiny_engine().generate([prompts[1]], greedy(12))[0].token_ids


def test_top_k_1_and_tiny_top_p_are_greedy(tiny_engine):
    engine = tiny_engine()
    prompts = random_prompts([4, 15], VOCAB, seed=8)
    ref = [o.token_ids for o in engine.generate(prompts, greedy(12))]
    for params in (
        SamplingParams(temperature=1.0, top_k=1, max_tokens=12, ignore_eos=True, seed=3),
        SamplingParams(temperature=2.0, top_p=1e-6, max_tokens=12, ignore_eos=True, seed=4),
    ):
        assert [o.token_ids for o in engine.generate(prompts, params)] == ref


def test_unseeded_requests_are_reproducible_across_processes():
    """EngineConfig.seed "seeds requests that do not carry their own seed": two processes with the
    same engine seed must sample the same tokens, whatever Python's hash randomization."""
    script = textwrap.dedent("""
        import torch
        from minieng import EngineConfig, LLMEngine, ModelConfig, SamplingParams
        from minieng.model.loader import LoadedModel, build_model, randomize
        cfg = ModelConfig(model_type="llama", vocab_size=64, hidden_size=16, intermediate_size=32,
                          num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                          rms_norm_eps=1e-6, max_position_embeddings=64, tie_word_embeddings=False)
        model = build_model(cfg, torch.float32, torch.device("cpu"), 64)
        randomize(model, seed=0)
        engine = LLMEngine(EngineConfig(device="cpu", block_size=4, num_kv_blocks=16, max_model_len=64, seed=0),
                           loaded=LoadedModel(model, None, None, set(), None))
        out = engine.generate([[1, 2, 3]], SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True))
        print(out[0].token_ids)
    """)
    runs = []
    for hash_seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=hash_seed)
        result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr[-2000:]
        runs.append(result.stdout.strip().splitlines()[-1])
    assert runs[0] == runs[1], f"same EngineConfig.seed, different tokens: {runs}"


def test_probabilities_temperature_top_k_top_p():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    p = probabilities(logits, SamplingParams(temperature=1.0))
    assert torch.allclose(p, torch.tensor([0.5, 0.3, 0.15, 0.05]), atol=1e-6)
    p = probabilities(logits, SamplingParams(temperature=0.5))
    assert torch.allclose(p, torch.softmax(logits / 0.5, -1), atol=1e-6)
    p = probabilities(logits, SamplingParams(top_k=2))
    assert torch.allclose(p, torch.tensor([0.625, 0.375, 0.0, 0.0]), atol=1e-6)
    # top_p keeps the smallest set whose mass reaches top_p: {0.5, 0.3} reaches 0.8.
    p = probabilities(logits, SamplingParams(top_p=0.8))
    assert torch.allclose(p, torch.tensor([0.625, 0.375, 0.0, 0.0]), atol=1e-5)
    p = probabilities(logits, SamplingParams(top_p=0.81))
    assert torch.allclose(p, torch.tensor([0.5, 0.3, 0.15, 0.0]) / 0.95, atol=1e-5)
    p = probabilities(logits, SamplingParams(top_p=1e-9))
    assert p.tolist() == [1.0, 0.0, 0.0, 0.0]
    batch = probabilities(torch.stack([logits, logits.flip(0)]), SamplingParams(top_k=1))
    assert batch.tolist() == [[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]]


# log(0.3) and log(0.1) are not exact in bfloat16 (0.5 + 0.3 rounds to 0.4997 + 0.2996 < 0.8):
# that boundary exists in float32 only. Uniform distributions are exact in both dtypes.
INEXACT_IN_BF16 = [
    ([0.3, 0.1, 0.1, 0.5], 0.8, {0, 3}),  # 0.5 + 0.3 reaches 0.8: nothing more is needed
    ([0.3, 0.1, 0.1, 0.5], 0.81, 3),
]  # just past it: one of the two 0.1 joins
EXACT = [
    ([0.25] * 4, 0.5, 2),
    ([0.25] * 4, 0.75, 3),
    ([0.25] * 4, 0.7500001, 4),
    ([0.125] * 8, 0.375, 3),
    ([0.125] * 8, 0.5, 4),
    ([0.5, 0.5], 0.5, 1),
    ([0.5, 0.5], 0.51, 2),
]


@pytest.mark.parametrize(
    "dtype,probs,top_p,kept",
    [(torch.float32, *case) for case in INEXACT_IN_BF16 + EXACT] + [(torch.bfloat16, *case) for case in EXACT],
)
def test_top_p_at_an_exact_boundary(dtype, probs, top_p, kept):
    """A token is kept only while the mass before it is strictly below top_p."""
    logits = torch.log(torch.tensor(probs)).to(dtype)
    p = probabilities(logits, SamplingParams(top_p=top_p))
    nonzero = set(torch.nonzero(p).flatten().tolist())
    if isinstance(kept, int):  # ties: which of the equal tokens stays does not matter
        assert len(nonzero) == kept, f"top_p={top_p} kept {sorted(nonzero)}"
    else:
        assert nonzero == kept, f"top_p={top_p} kept {sorted(nonzero)}"
    assert p.dtype == torch.float32 and abs(p.sum().item() - 1) < 1e-6


def test_sample_frequencies_follow_the_distribution():
    """Chi-square goodness of fit, 4 degrees of freedom: a correct sampler exceeds the critical
    value 18.47 with probability 0.001 for a random seed; this seed is fixed, so the test is
    deterministic."""
    logits = torch.log(torch.tensor([0.4, 0.25, 0.2, 0.1, 0.05]))
    params = SamplingParams(temperature=1.0, seed=0)
    rng = KeyedRandom(1234)
    n = 4000
    draws = sample(logits.repeat(n, 1), [params] * n, [rng] * n, list(range(n)))  # n output positions
    counts = torch.bincount(torch.tensor(draws), minlength=5).float()
    expected = n * torch.tensor([0.4, 0.25, 0.2, 0.1, 0.05])
    chi2 = (((counts - expected) ** 2) / expected).sum().item()
    assert chi2 < 18.47, f"chi2={chi2:.1f}, counts {counts.tolist()}"
    assert sample(logits[None], [SamplingParams(temperature=0)], [None], [0]) == [0]


def test_a_step_of_sampled_rows_reaches_the_host_once(monkeypatch):
    """Eight rows, greedy and sampled under two settings: one transfer of the step's tokens to the
    host (on a GPU each is a sync), not one per sampled row; the same tokens as row by row."""
    from torch.utils._python_dispatch import TorchDispatchMode

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(8, 50, generator=gen) * 2
    hot, cold = SamplingParams(temperature=1.0, top_p=0.9), SamplingParams(temperature=0.5, top_k=5)
    params = [hot, SamplingParams(temperature=0), cold, hot, hot, cold, SamplingParams(temperature=0), hot]
    rngs = [KeyedRandom(seed) for seed in range(8)]
    positions = list(range(8))
    one_by_one = [
        sample(logits[i : i + 1], params[i : i + 1], rngs[i : i + 1], positions[i : i + 1])[0] for i in range(8)
    ]

    transfers = []
    tolist = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: transfers.append("tolist") or tolist(t))

    class Scalars(TorchDispatchMode):  # int(t) and t.item() dispatch _local_scalar_dense
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.__name__.startswith("_local_scalar_dense"):
                transfers.append("item")
            return func(*args, **(kwargs or {}))

    with Scalars():
        tokens = sample(logits, params, rngs, positions)
    assert transfers == ["tolist"] and tokens == one_by_one


def test_a_sampling_step_copies_to_the_device_without_waiting(monkeypatch):
    """On a GPU a blocking host-to-device copy synchronizes the stream (torch's ``memcpy_and_sync``):
    the rows' index and host-drawn noise go to the logits' device with ``non_blocking=True``. The
    logits live on the meta device here, so every copy to them is seen by the dispatcher."""
    from torch.utils._python_dispatch import TorchDispatchMode

    logits = torch.empty(4, 50, device="meta")
    hot, cold = SamplingParams(temperature=1.0, top_p=0.9), SamplingParams(temperature=0.5, top_k=5)
    params = [hot, SamplingParams(temperature=0), cold, hot]
    rngs = [KeyedRandom(seed) for seed in range(4)]  # on the host: their noise must be copied
    copies = []

    class Copies(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func.__name__.startswith("_to_copy") and kwargs.get("device") == torch.device("meta"):
                copies.append(kwargs.get("non_blocking", False))
            return func(*args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: [0] * t.shape[0])  # meta tensors hold no values
    with Copies():
        sample(logits, params, rngs, list(range(4)))
    assert copies and all(copies), f"blocking copies to the device: {copies}"  # index and noise, two groups


def test_keyed_draws_depend_on_seed_and_position_only():
    """A row's token is a function of its logits, its seed and its output position: not of the
    other rows, their order, or how many draws came before (what makes seeds reproducible)."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 50, generator=gen) * 2
    params = [SamplingParams(temperature=1.0, top_p=0.9)] * 6
    rngs = [KeyedRandom(seed) for seed in (1, 2, 3, 1, 2, 3)]
    positions = [0, 0, 0, 5, 5, 5]
    tokens = sample(logits, params, rngs, positions)
    order = [4, 2, 0, 5, 1, 3]
    shuffled = sample(
        logits[order], [params[i] for i in order], [rngs[i] for i in order], [positions[i] for i in order]
    )
    assert shuffled == [tokens[i] for i in order]
    for i in range(6):  # alone, after unrelated draws from the same request's KeyedRandom
        rngs[i].exponentials(99, 50)
        assert sample(logits[i : i + 1], params[:1], [KeyedRandom(rngs[i].seed)], [positions[i]]) == [tokens[i]]
    assert torch.equal(KeyedRandom(7).exponentials(3, 10), KeyedRandom(7).exponentials(3, 10))
    assert not torch.equal(KeyedRandom(7).exponentials(3, 10), KeyedRandom(7).exponentials(4, 10))
    assert not torch.equal(KeyedRandom(7).exponentials(3, 10), KeyedRandom(8).exponentials(3, 10))


def test_the_race_never_picks_a_token_of_probability_zero():
    probs = torch.tensor([[0.0, 0.7, 0.0, 0.3]] * 3)
    noise = torch.tensor([[0.0, 1.0, 1e-300, 5.0], [1.0, 0.0, 1.0, 1.0], [1e-9, 2.0, 1e-9, 1e-9]], dtype=torch.float64)
    assert race(probs, noise).tolist() == [1, 1, 3]


# -- streaming and the detokenizer --------------------------------------------------------------------


@pytest.mark.real_model
def test_stream_deltas_concatenate_to_the_text(default_model, real_engine):
    engine = real_engine()
    tok = default_model.tokenizer
    prompt = chat_ids(tok, "Write 'hello' in Chinese, Japanese and Korean, then add three emoji.")
    deltas = list(engine.stream(prompt, SamplingParams(temperature=0, max_tokens=48)))
    rid = list(engine.requests)[-1]
    final = engine.output(rid)
    assert final.finished and len(deltas) > 1
    assert "".join(deltas) == final.text == tok.decode(final.token_ids, skip_special_tokens=True)
    if "\ufffd" not in final.text:
        assert not any("\ufffd" in d for d in deltas)
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


MULTIBYTE_TEXT = "héllo 🤗 世界 ✨ naïve café 日本語のテキスト 🚀🔥"


def feed(detok: IncrementalDetokenizer, ids: list[int], chunk: int) -> list[str]:
    deltas = [detok.add(ids[i : i + chunk]) for i in range(0, len(ids), chunk)]
    return deltas + [detok.finish()]


@pytest.mark.real_model
@pytest.mark.parametrize("chunk", [1, 2, 3])
def test_detokenizer_never_splits_a_character(default_model, chunk):
    tok = default_model.tokenizer
    ids = tok.encode(MULTIBYTE_TEXT)
    assert tok.decode(ids) == MULTIBYTE_TEXT
    # The test is only meaningful if some token boundary falls inside a UTF-8 character.
    assert any(tok.decode(ids[:k]).endswith("\ufffd") for k in range(1, len(ids))), "no split character"
    detok = IncrementalDetokenizer(tok)
    deltas = feed(detok, ids, chunk)
    assert not any("\ufffd" in d for d in deltas)
    assert "".join(deltas) == MULTIBYTE_TEXT == detok.output_text


ALPHABET = "ab é世界🤗✨.\n"


@pytest.mark.real_model
@settings(max_examples=60, deadline=None)
@given(text=st.text(alphabet=ALPHABET, min_size=1, max_size=30), data=st.data())
def test_detokenizer_with_stop_strings(default_model, text, data):
    tok = default_model.tokenizer
    ids = tok.encode(text)
    full = tok.decode(ids)
    stop = data.draw(
        st.one_of(
            st.text(alphabet=ALPHABET, min_size=1, max_size=4),
            st.integers(0, len(full) - 1).flatmap(
                lambda i: st.integers(i + 1, min(i + 4, len(full))).map(lambda j: full[i:j])
            ),
        )
    )
    detok = IncrementalDetokenizer(tok, stop=[stop])
    deltas = feed(detok, ids, data.draw(st.integers(1, 3)))
    hit = full.find(stop)
    expected = full if hit == -1 else full[:hit]
    assert "".join(deltas) == expected == detok.output_text
    assert detok.stopped == (hit != -1)
    assert not any(stop in d for d in deltas)
    assert not any("\ufffd" in d for d in deltas)


# -- steps, timestamps, step records, abort ------------------------------------------------------------


def run_steps(engine: LLMEngine):
    """Step to completion; per request, the new_token_ids and deltas seen in step outputs."""
    seen: dict[str, list[list[int]]] = {}
    finished_at: dict[str, int] = {}
    step = 0
    while engine.has_unfinished_requests():
        step += 1
        assert step < 1000
        for out in engine.step():
            assert out.request_id not in finished_at, "an output after the request finished"
            seen.setdefault(out.request_id, []).append(out.new_token_ids)
            assert out.token_ids[-len(out.new_token_ids) :] == out.new_token_ids
            assert sum(len(x) for x in seen[out.request_id]) == len(out.token_ids)
            if out.finished:
                finished_at[out.request_id] = step
    return seen, finished_at


def test_step_outputs_and_timestamps(tiny_engine):
    engine = tiny_engine(max_num_batched_tokens=8, max_num_seqs=4)
    prompts = random_prompts([5, 20, 13, 2], VOCAB, seed=9)
    ids = [engine.add_request(p, greedy(n)) for p, n in zip(prompts, (6, 3, 9, 1))]
    seen, finished_at = run_steps(engine)
    assert set(finished_at) == set(ids)
    for rid, n in zip(ids, (6, 3, 9, 1)):
        out = engine.output(rid)
        assert out.finished and len(out.token_ids) == n
        assert [t for new in seen[rid] for t in new] == out.token_ids
        assert all(len(new) == 1 for new in seen[rid])
        times = out.times
        assert times.arrival_s <= times.first_scheduled_s <= times.emissions[0][0]
        assert len(times.emissions) == len(out.token_ids) == sum(k for _, k in times.emissions)
        stamps = [t for t, _ in times.emissions]
        assert stamps == sorted(stamps) and times.finished_s == stamps[-1]
    for rec in engine.step_records:
        assert rec.duration_s >= 0
        assert sum(n for n, _, _ in rec.chunks) <= 8


@pytest.mark.parametrize(
    "case,prompt_lengths,chunked,budget",
    [
        ("whole prompts", [5, 20, 13], False, 64),
        ("chunked prompts", [20, 13], True, 10),
        ("a one-token prompt", [1, 5], False, 64),
    ],
)
def test_step_records_count_prefill_tokens_and_decodes(tiny_engine, case, prompt_lengths, chunked, budget):
    """Without preemption every prompt token is prefilled once and every output token but the
    first comes from a decode; the records must say so, whatever the chunking."""
    engine = tiny_engine(enable_chunked_prefill=chunked, max_num_batched_tokens=budget, max_num_seqs=4)
    prompts = random_prompts(prompt_lengths, VOCAB, seed=10)
    outputs = engine.generate(prompts, greedy(5))
    records = engine.step_records
    assert sum(r.num_preempted for r in records) == 0
    assert sum(r.num_prefill_tokens for r in records) == sum(prompt_lengths), case
    assert sum(r.num_decode_seqs for r in records) == sum(len(o.token_ids) - 1 for o in outputs), case
    for r in records:
        assert r.num_prefill_seqs + r.num_decode_seqs == len(r.chunks)
        assert r.num_prefill_tokens + r.num_decode_seqs == sum(n for n, _, _ in r.chunks)
    assert records[-1].num_running == 0 and records[-1].num_waiting == 0 and records[-1].num_used_blocks == 0


def test_step_records_of_one_chunked_request(tiny_engine):
    """A 9-token prompt under a budget of 8: a chunk of 8, a chunk of 1 that completes the prompt
    (a prefill), then one decode per further output token (the last one included)."""
    engine = tiny_engine(enable_chunked_prefill=True, max_num_batched_tokens=8, max_num_seqs=4)
    engine.generate(random_prompts([9], VOCAB, seed=13), greedy(5))
    steps = [(r.num_prefill_tokens, r.num_prefill_seqs, r.num_decode_seqs) for r in engine.step_records]
    assert steps == [(8, 1, 0), (1, 1, 0)] + [(0, 0, 1)] * 4
    assert [r.chunks for r in engine.step_records[:3]] == [[(8, 0, False)], [(1, 8, True)], [(1, 9, True)]]


def test_engine_keyword_overrides_are_validated(tiny_llama):
    loaded = tiny_llama[1]
    engine = LLMEngine(EngineConfig(device="cpu"), loaded=loaded, max_num_seqs=3, num_kv_blocks=64, max_model_len=64)
    assert engine.config.max_num_seqs == 3 and engine.max_model_len == 64
    with pytest.raises(ValueError, match="block_size=0"):
        LLMEngine(loaded=loaded, block_size=0)


def test_abort_request_frees_its_blocks(tiny_engine):
    engine = tiny_engine(max_num_seqs=2)
    bm = engine.block_manager
    prompts = random_prompts([10, 22, 7], VOCAB, seed=12)
    ids = [engine.add_request(p, greedy(30)) for p in prompts]
    engine.step()
    engine.step()
    running = engine.requests[ids[1]].seq
    held = len(running.block_table)
    assert held > 0
    used = bm.num_used_blocks
    engine.abort_request(ids[1])
    assert running.block_table == [] and bm.num_used_blocks == used - held
    assert engine.output(ids[1]).finish_reason == "abort"
    engine.abort_request(ids[2])  # still waiting (max_num_seqs=2)
    assert engine.output(ids[2]).finished
    bm.check_invariants([r.seq for r in engine.requests.values()])
    engine.abort_request(ids[1])  # aborting twice is harmless
    while engine.has_unfinished_requests():
        engine.step()
    assert len(engine.output(ids[0]).token_ids) == 30
    assert bm.num_free_blocks == bm.num_blocks
    bm.check_invariants([r.seq for r in engine.requests.values()])


def test_generate_accepts_one_prompt_or_many(tiny_engine):
    engine = tiny_engine()
    one = engine.generate([3, 4, 5], greedy(4))
    assert len(one) == 1 and one[0].prompt_token_ids == [3, 4, 5]
    many = engine.generate([[3, 4, 5], [6]], greedy(4))
    assert [o.prompt_token_ids for o in many] == [[3, 4, 5], [6]]
    assert many[0].token_ids == one[0].token_ids


def test_reconfigured_validates_and_always_restores(tiny_engine):
    """Experiments change per-step fields on a live engine through ``reconfigured``: the new config
    is validated like any EngineConfig, the scheduler sees it, and the old one comes back even when
    the block raises. Fields the built engine cannot change are refused."""
    engine = tiny_engine(max_num_seqs=4, max_num_batched_tokens=64)
    built = engine.config
    with engine.reconfigured(max_num_batched_tokens=8, enable_chunked_prefill=True):
        assert engine.config.max_num_batched_tokens == 8 and engine.scheduler.config is engine.config
        out = engine.generate([[1] * 20], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))[0]
        assert len(out.token_ids) == 2
        assert max(s.num_prefill_tokens for s in engine.step_records) <= 8  # the prompt ran in chunks
    assert engine.config is built and engine.scheduler.config is built
    with pytest.raises(RuntimeError, match="inside"):
        with engine.reconfigured(max_num_batched_tokens=16):
            raise RuntimeError("inside")
    assert engine.config is built
    with pytest.raises(ValueError, match=r"max_num_batched_tokens=2 is invalid"):  # the dataclass's own check
        with engine.reconfigured(max_num_batched_tokens=2):
            pass
    with pytest.raises(ValueError, match=r"only .* can change"):
        with engine.reconfigured(block_size=8):
            pass
    with pytest.raises(ValueError, match=r"max_num_seqs=8.*at most the 4"):
        with engine.reconfigured(max_num_seqs=8):
            pass
    assert engine.config is built
