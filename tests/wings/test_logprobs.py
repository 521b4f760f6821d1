"""Log-probabilities (``SamplingParams.logprobs`` and ``prompt_logprobs``, vLLM's names) equal
transformers' ``log_softmax`` over the same tokens (float32, within 1e-4) on every path the engine
runs a token through: eager, chunked prefill, the CUDA-graph decode path (its static buffers,
replayed eagerly on a CPU), the compiled CPU decode step, speculative decoding (prompt lookup and
a draft model: an accepted draft's is the target's), preemption and recompute, a warm prefix cache,
and two tensor-parallel ranks. Also: the shape of each entry (the token first, then the top k by
rank), scoring a prompt with ``max_tokens=0``, the refusals, and that a request which asks for
nothing gets None and costs no extra LM-head row.
"""

from __future__ import annotations

import pytest
import torch
from helpers import bos_tokenizer, hf_logits, make_engine, random_prompts

from minieng import EngineConfig, LLMEngine, SamplingParams
from minieng.wings.fast_paths import compilation
from minieng.wings import logprobs as logprobs_module
from minieng.wings.fast_paths import strategy as model_runner_module
from minieng.core import scheduler as scheduler_module
from minieng.wings.fast_paths.cuda_graph import DecodeGraphs
from minieng.core.outputs import Logprob, RequestOutput
from minieng.model.loader import LoadedModel

VOCAB = 300  # the tiny Llama's
TOL = 1e-4  # float32: the engine's paged forward against transformers' eager one
OUT = 12


def greedy(max_tokens: int = OUT, **kw) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, **kw)


def reference_logprobs(hf, out: RequestOutput) -> torch.Tensor:
    """transformers' log_softmax at every position of the request's prompt + output: [n, vocab]."""
    return torch.log_softmax(hf_logits(hf, out.prompt_token_ids + out.token_ids), dim=-1)


def check_position(entry: dict[int, Logprob], token: int, ref_row: torch.Tensor, k: int, what: str) -> None:
    """One position's dict against transformers' log-probabilities ``ref_row`` [vocab]: the token
    first, with its value and rank; then the top k, ranks 1..k, values those of ``ref_row``'s k
    largest (ties allowed to swap ids)."""
    items = list(entry.items())
    assert items[0][0] == token, f"{what}: the token asked about comes first"
    value = ref_row[token].item()
    assert abs(items[0][1].logprob - value) < TOL, f"{what}: {items[0][1].logprob} vs transformers' {value}"
    # its rank counts the tokens at least as likely (vLLM's), up to float rounding near ties
    above, at_least = int((ref_row > value + TOL).sum()), int((ref_row >= value - TOL).sum())
    assert above + 1 <= items[0][1].rank <= at_least, (
        f"{what}: rank {items[0][1].rank} not in [{above + 1}, {at_least}]"
    )
    assert all(lp.rank <= k for _, lp in items[1:]), f"{what}: an entry after the first outside the top {k}"
    top = [(i, lp) for i, lp in items if lp.rank <= k]
    ranks = sorted(lp.rank for _, lp in top)
    assert ranks == list(range(1, k + 1)), f"{what}: top ranks {ranks}, expected 1..{k}"
    expected_top = ref_row.topk(k).values.tolist() if k else []
    got_top = [lp.logprob for _, lp in sorted(top, key=lambda item: item[1].rank)]
    assert got_top == pytest.approx(expected_top, abs=TOL), f"{what}: top-{k} values"
    for token_id, lp in top:
        assert abs(lp.logprob - ref_row[token_id].item()) < TOL, f"{what}: top token {token_id}"
    assert len(entry) in (k, k + 1), f"{what}: {len(entry)} entries for k={k}"


def check_output(hf, out: RequestOutput, params: SamplingParams, what: str) -> None:
    """Every log-probability of ``out`` against transformers, and the sums the issue names."""
    ref = reference_logprobs(hf, out)
    prompt, tokens = out.prompt_token_ids, out.token_ids
    p = len(prompt)
    if params.logprobs is None:
        assert out.logprobs is None and out.new_logprobs is None, f"{what}: logprobs not asked"
    else:
        assert len(out.logprobs) == len(tokens), f"{what}: one dict per generated token"
        for j, (entry, token) in enumerate(zip(out.logprobs, tokens)):
            check_position(entry, token, ref[p - 1 + j], params.logprobs, f"{what}, output {j}")
        total = sum(entry[token].logprob for entry, token in zip(out.logprobs, tokens))
        expected = sum(ref[p - 1 + j, token].item() for j, token in enumerate(tokens))
        assert total == pytest.approx(expected, abs=TOL), f"{what}: the continuation's sum"
    if params.prompt_logprobs is None:
        assert out.prompt_logprobs is None, f"{what}: prompt_logprobs not asked"
    else:
        assert len(out.prompt_logprobs) == p and out.prompt_logprobs[0] is None, f"{what}: one per prompt token"
        for i in range(1, p):
            check_position(out.prompt_logprobs[i], prompt[i], ref[i - 1], params.prompt_logprobs, f"{what}, prompt {i}")
        total = sum(out.prompt_logprobs[i][prompt[i]].logprob for i in range(1, p))
        expected = sum(ref[i - 1, prompt[i]].item() for i in range(1, p))
        assert total == pytest.approx(expected, abs=TOL), f"{what}: the prompt's sum"


# -- every path gives transformers' log-probabilities ------------------------------------------------


def install_graphs(engine: LLMEngine) -> None:
    """The CUDA-graph decode path as a GPU builds it (its static logits buffer, its buckets and
    padding rows), replayed eagerly on this CPU (``DecodeGraphs(capture=False)``)."""
    engine.runner.fast.graphs = DecodeGraphs(
        engine.model,
        engine.kv_cache,
        engine.config.max_num_seqs,
        engine.max_model_len,
        1 << 30,
        tuple(range(1, engine.config.num_speculative_tokens + 2)),
        capture=False,
    )


PATHS = {
    "eager": dict(),
    "chunked": dict(max_num_seqs=4, max_num_batched_tokens=8),
    "graphs": dict(max_num_seqs=4),
    "compiled": dict(compile=True, max_num_seqs=4, max_num_batched_tokens=64),
    "ngram": dict(speculative_method="ngram", num_speculative_tokens=3),
    # the target's own weights as the draft: every draft accepted, each token's from the target
    "draft": dict(speculative_method="draft", num_speculative_tokens=3),
    # a W8A8 copy as the draft: some drafts rejected too
    "draft_w8a8": dict(speculative_method="draft", num_speculative_tokens=3, draft_quantization="w8a8"),
}


def mixed_batch() -> tuple[list[list[int]], list[SamplingParams]]:
    """Prompts of 28 (a repeated motif, for prompt lookup), 30, 5 and 1 tokens, asking for
    different things: both kinds, nothing, the generated token's only, the prompt's only."""
    motif = random_prompts([7], VOCAB, seed=12)[0]
    prompts = [motif * 4, *random_prompts([30, 5, 1], VOCAB, seed=13)]
    params = [
        greedy(logprobs=3, prompt_logprobs=2),
        greedy(),
        greedy(logprobs=0),
        greedy(prompt_logprobs=4),
    ]
    return prompts, params


@pytest.mark.parametrize("path", list(PATHS))
def test_every_path_gives_transformers_log_probabilities(tiny_llama, path, monkeypatch):
    if path == "compiled" and compilation.compiler_missing(torch.device("cpu")) is not None:
        pytest.skip("torch.compile on a CPU needs a C++ compiler")
    if path == "draft_w8a8" and "fbgemm" not in torch.backends.quantized.supported_engines:
        pytest.skip("W8A8 on a CPU needs fbgemm")
    hf, loaded = tiny_llama
    engine = make_engine(loaded, **PATHS[path])
    if path == "graphs":
        install_graphs(engine)
    compiled_steps = []
    if path == "compiled":
        assert engine.runner.fast.compiled_decode is not None
        run = model_runner_module.run_decode
        monkeypatch.setattr(
            model_runner_module, "run_decode", lambda *a: compiled_steps.append(1) or run(*a)
        )  # counts the compiled decode steps
    prompts, params = mixed_batch()
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
    graphed = []
    while engine.has_unfinished_requests():
        engine.step()
        graphed.append((engine.runner.last_forward_path == "cuda_graph"))
    for i, (request_id, sp) in enumerate(zip(ids, params)):
        check_output(hf, engine.output(request_id), sp, f"{path}, request {i}")
    # the path under test ran
    if path == "chunked":
        assert any(ctx > 0 and n > 1 for r in engine.step_records for n, ctx, _ in r.chunks), "no prompt spanned chunks"
    if path == "graphs":
        assert any(graphed), "no decode step went through the graphs' buffers"
    if path == "compiled":
        assert compiled_steps, "no decode step ran the compiled step"
    if engine.config.num_speculative_tokens:
        accepted = sum(r[3] for r in engine.spec_records)
        assert accepted > 0, "no draft was accepted: the verification rows were never read"
        if path == "draft":
            assert accepted == sum(r[2] for r in engine.spec_records)
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def run_and_check_rows(hf, engine: LLMEngine, prompts, params) -> list[int]:
    """Run the requests to the end, check every entry against transformers, and return the rows of
    logits each step computed (``StepRecord.chunks``' third figure, summed)."""
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
    while engine.has_unfinished_requests():
        engine.step()
    for i, (request_id, sp) in enumerate(zip(ids, params)):
        check_output(hf, engine.output(request_id), sp, f"request {i}")
    return [sum(r for _, _, r in record.chunks) for record in engine.step_records]


def test_prompt_rows_are_cut_to_the_step_s_share_and_every_entry_still_arrives(tiny_llama, monkeypatch):
    """Five prompt rows a step (``PROMPT_ROWS_PER_STEP``, 256 in earnest) for the prompts owing
    log-probabilities: their chunks are cut to what is left of it, no step computes more rows of
    logits than ``max_logits_rows`` (what the memory profile counts), and every entry is
    transformers' still. Without the cut the 28-token prompt would run in one chunk of 28 rows."""
    from minieng.wings import logprobs
    from minieng.core import scheduler

    monkeypatch.setattr(scheduler, "PROMPT_ROWS_PER_STEP", 5)
    monkeypatch.setattr(logprobs, "PROMPT_ROWS_PER_STEP", 5)
    hf, loaded = tiny_llama
    engine = make_engine(loaded, max_num_seqs=4, max_num_batched_tokens=64)
    prompts, params = mixed_batch()
    rows = run_and_check_rows(hf, engine, prompts, params)
    assert max(rows) <= logprobs.max_logits_rows(engine.config.max_num_seqs) == 4 + 5
    scored = [n for record in engine.step_records for n, _, r in record.chunks if r > 1]  # chunks owing rows
    assert max(scored) <= 5 and len(scored) >= (28 + 1) // 5  # the 28-token prompt ran in cut chunks


def test_without_chunking_a_scored_prompt_runs_whole_when_its_rows_fit_and_is_refused_otherwise(
    tiny_llama, monkeypatch
):
    """Without chunked prefill a prompt is never cut: prompts owing log-probabilities wait for a
    step with room among ``PROMPT_ROWS_PER_STEP`` (5 here), and one longer than that is refused
    when it is added, saying to enable chunked prefill (its logits alone would exceed the profile)."""
    from minieng.core import engine_core, scheduler
    from minieng.wings import logprobs

    for module in (scheduler, logprobs, engine_core):
        monkeypatch.setattr(module, "PROMPT_ROWS_PER_STEP", 5)
    hf, loaded = tiny_llama
    engine = make_engine(loaded, max_num_seqs=4, max_num_batched_tokens=64, enable_chunked_prefill=False)
    prompts = random_prompts([6, 5, 6, 9], VOCAB, seed=21)
    params = [greedy(prompt_logprobs=2), greedy(prompt_logprobs=1), greedy(), greedy(logprobs=1)]
    rows = run_and_check_rows(hf, engine, prompts, params)
    assert max(rows) <= logprobs.max_logits_rows(4)
    # the 6- and 5-token prompts owe 5 and 4 rows: they cannot share a step of 5
    scored_steps = [r for r in engine.step_records if any(n in (5, 6) and rows > 2 for n, _, rows in r.chunks)]
    assert len(scored_steps) == 2
    with pytest.raises(ValueError, match="enable_chunked_prefill=True"):
        engine.add_request(random_prompts([7], VOCAB, seed=22)[0], greedy(prompt_logprobs=0))


def test_preemption_and_recompute_neither_lose_nor_repeat_an_entry(tiny_llama, monkeypatch):
    """Twelve 4-token blocks for three requests of 19 to 25 prompt tokens: requests are preempted,
    one in the middle of its prompt, and recomputed (partly from the blocks it cached)."""
    hf, loaded = tiny_llama
    preempted_mid_prompt = []
    preempt = scheduler_module.Scheduler._preempt

    def recorded(self, seq, out):
        if seq.prompt_logprobs is not None and len(seq.prompt_logprobs) < seq.num_prompt_tokens:
            preempted_mid_prompt.append(seq.request_id)
        preempt(self, seq, out)

    monkeypatch.setattr(scheduler_module.Scheduler, "_preempt", recorded)
    engine = make_engine(loaded, num_kv_blocks=12, max_model_len=40, max_num_seqs=4, max_num_batched_tokens=8)
    prompts = random_prompts([22, 19, 25], VOCAB, seed=2)
    params = greedy(logprobs=2, prompt_logprobs=2)
    outs = engine.generate(prompts, params)
    assert sum(r.num_preempted for r in engine.step_records) >= 2
    assert preempted_mid_prompt, "no request was preempted while its prompt log-probabilities were incomplete"
    for i, out in enumerate(outs):
        check_output(hf, out, params, f"preemption, request {i}")


def test_a_warm_prefix_cache_still_gives_every_prompt_log_probability(tiny_llama):
    """The second identical request reads nothing from the cache (vLLM V1 skips reading it for
    prompt_logprobs) and gets the first's entries; the blocks it writes serve a plain request."""
    hf, loaded = tiny_llama
    engine = make_engine(loaded)
    prompt = random_prompts([30], VOCAB, seed=21)[0]
    params = greedy(4, logprobs=2, prompt_logprobs=3)
    first, second = (engine.generate([prompt], params)[0] for _ in range(2))
    assert first.num_cached_tokens == second.num_cached_tokens == 0
    check_output(hf, second, params, "warm cache")
    for i in range(1, len(prompt)):
        a, b = first.prompt_logprobs[i], second.prompt_logprobs[i]
        assert list(a) == list(b) and [x.rank for x in a.values()] == [x.rank for x in b.values()]
        assert [x.logprob for x in a.values()] == pytest.approx([x.logprob for x in b.values()], abs=1e-6)
    plain = engine.generate([prompt], greedy(4))[0]
    assert plain.num_cached_tokens == 28, "the prompt_logprobs requests' full blocks were not cached"
    # vLLM's prefix-cache queries count only the requests that read the cache: the plain one
    lookups = [lookup for r in engine.step_records for lookup in r.prefix_cache_lookups]
    assert lookups == [(30, 28)]


def test_two_tensor_parallel_ranks_give_the_same_log_probabilities(tiny_llama, tmp_path):
    """The workers run the extra rows too (the LM head is split over the ranks and gathered)."""
    hf, _ = tiny_llama
    hf.save_pretrained(tmp_path)
    prompts, params = mixed_batch()
    with LLMEngine(
        model=str(tmp_path), device="cpu", block_size=4, num_kv_blocks=64, max_model_len=64, tensor_parallel_size=2
    ) as engine:
        outs = engine.generate(prompts, params)
    for i, (out, sp) in enumerate(zip(outs, params)):
        check_output(hf, out, sp, f"tensor parallel, request {i}")


# -- the shape of the entries --------------------------------------------------------------------------


def test_entries_are_raw_log_probabilities_ranked_with_the_sampled_token_always_present(tiny_llama):
    """Sampled at temperature 1.5 with top_k=50: the values are still the raw distribution's (before
    temperature and top-k), and a drawn token outside the top 2 is there with its rank."""
    hf, loaded = tiny_llama
    engine = make_engine(loaded)
    params = SamplingParams(temperature=1.5, top_k=50, seed=3, max_tokens=40, ignore_eos=True, logprobs=2)
    out = engine.generate(random_prompts([9], VOCAB, seed=4), params)[0]
    check_output(hf, out, params, "sampled")
    outside = [entry[t] for entry, t in zip(out.logprobs, out.token_ids) if entry[t].rank > 2]
    assert outside and all(len(entry) == 3 for entry, t in zip(out.logprobs, out.token_ids) if entry[t].rank > 2)
    for entry in out.logprobs:
        by_rank = sorted(entry.values(), key=lambda lp: lp.rank)
        assert by_rank[0].rank == 1 and all(a.logprob >= b.logprob for a, b in zip(by_rank, by_rank[1:]))
        assert all(lp.logprob <= 0 and lp.decoded_token is None for lp in entry.values())  # no tokenizer
    only_token = engine.generate(random_prompts([9], VOCAB, seed=4), greedy(3, logprobs=0))[0]
    assert [list(entry) for entry in only_token.logprobs] == [[t] for t in only_token.token_ids]
    assert all(entry[t].rank == 1 for entry, t in zip(only_token.logprobs, only_token.token_ids))  # greedy


def test_decoded_tokens_are_the_tokenizer_s_text_of_each_id(tiny_llama):
    _, loaded = tiny_llama
    tokenizer = bos_tokenizer()
    engine = make_engine(LoadedModel(loaded.model, tokenizer, loaded.hf_config, {2}, None))
    out = engine.generate(["w5 w6 w7 w8"], greedy(4, logprobs=3, prompt_logprobs=2))[0]
    entries = out.logprobs + out.prompt_logprobs[1:]
    assert len(entries) == 4 + 4  # BOS and four words: four prompt entries
    for entry in entries:
        for token_id, lp in entry.items():
            assert lp.decoded_token == tokenizer.decode([token_id])
    assert out.prompt_logprobs[1][5].decoded_token == "w5"


def test_streamed_outputs_carry_their_new_tokens_log_probabilities(tiny_llama):
    """Each step's ``new_logprobs`` belong to its ``new_token_ids`` (several a step, with drafts),
    and they add up to the final ``logprobs``; a stop token inside accepted drafts drops the
    entries after it with the tokens."""
    hf, loaded = tiny_llama
    prompt = random_prompts([11], VOCAB, seed=6)[0]
    plain = make_engine(loaded).generate([prompt], greedy(16))[0].token_ids
    stop = plain[9]
    params = SamplingParams(temperature=0, max_tokens=16, stop_token_ids=[stop], logprobs=1, prompt_logprobs=1)
    engine = make_engine(loaded, speculative_method="draft", num_speculative_tokens=4)
    request_id = engine.add_request(prompt, params)
    streamed, tokens, firsts = [], [], []
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert len(out.new_logprobs) == len(out.new_token_ids)
            assert all(t in entry for t, entry in zip(out.new_token_ids, out.new_logprobs))
            assert len(out.prompt_logprobs) == len(prompt)
            streamed += out.new_logprobs
            tokens += out.new_token_ids
            firsts.append(len(out.new_token_ids))
    final = engine.output(request_id)
    assert max(firsts) > 1, "no step emitted several tokens"
    assert tokens == final.token_ids == plain[: plain.index(stop) + 1]
    assert streamed == final.logprobs
    check_output(hf, final, params, "streamed")


# -- scoring a prompt: max_tokens=0 ------------------------------------------------------------------


def test_max_tokens_zero_scores_the_prompt_without_generating(tiny_llama):
    hf, loaded = tiny_llama
    engine = make_engine(loaded, max_model_len=40, max_num_seqs=4, max_num_batched_tokens=16)
    prompts = random_prompts([40, 17, 23], VOCAB, seed=7)  # the first fills max_model_len
    scoring = SamplingParams(max_tokens=0, prompt_logprobs=1, logprobs=5)
    params = [scoring, greedy(6), SamplingParams(max_tokens=0, prompt_logprobs=0)]
    outs = engine.generate(prompts, params)
    for i in (0, 2):
        out = outs[i]
        assert out.finished and out.finish_reason == "length"
        assert out.token_ids == [] and out.text == "" and out.times.emissions == []
        check_output(hf, out, params[i], f"scoring, request {i}")
    assert outs[0].logprobs == [] and outs[2].logprobs is None
    assert len(outs[1].token_ids) == 6 and outs[1].prompt_logprobs is None
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    # the scored prompt's blocks were written to the cache: a plain request reads them
    again = engine.generate([prompts[2] + [1, 2]], greedy(1))[0]
    assert again.num_cached_tokens == 20
    with pytest.raises(ValueError, match="max_model_len=40"):
        engine.add_request(prompts[0], greedy(1))  # generating needs room for a token


# -- refusals and nothing asked ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(max_tokens=0), "max_tokens=0.*prompt_logprobs"),
        (dict(max_tokens=0, logprobs=2), "max_tokens=0.*prompt_logprobs"),
        (dict(logprobs=-1), "logprobs=-1.*>= 0"),
        (dict(prompt_logprobs=-2), "prompt_logprobs=-2.*>= 0"),
        (dict(logprobs=True), "logprobs=True.*integer"),
        (dict(prompt_logprobs=1.5), "prompt_logprobs=1.5.*integer"),
    ],
)
def test_bad_logprobs_params_are_refused_naming_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_more_log_probabilities_than_max_logprobs_are_refused(tiny_engine):
    engine = tiny_engine()
    assert engine.config.max_logprobs == 20  # vLLM's default
    for field in ("logprobs", "prompt_logprobs"):
        with pytest.raises(ValueError, match=rf"{field}=21 .*max_logprobs=20"):
            engine.add_request([1, 2, 3], SamplingParams(**{field: 21}))
    engine.add_request([1, 2, 3], SamplingParams(logprobs=20, prompt_logprobs=20))  # the cap itself is fine
    small = tiny_engine(max_logprobs=2)
    with pytest.raises(ValueError, match="prompt_logprobs=3 .*max_logprobs=2"):
        small.generate([[1, 2, 3]], SamplingParams(prompt_logprobs=3))
    assert not small.has_unfinished_requests()
    with pytest.raises(ValueError, match="max_logprobs=-1"):
        EngineConfig(max_logprobs=-1)


def test_a_request_that_asks_for_nothing_gets_none_and_no_extra_row(tiny_llama, monkeypatch):
    _, loaded = tiny_llama
    calls = []
    gather = logprobs_module.gather_logprobs
    monkeypatch.setattr(logprobs_module, "gather_logprobs", lambda *a: calls.append(a[0].shape[0]) or gather(*a))
    engine = make_engine(loaded)
    prompts = random_prompts([30, 9], VOCAB, seed=8)
    outs = engine.generate(prompts, greedy(5))
    assert all(o.logprobs is None and o.new_logprobs is None and o.prompt_logprobs is None for o in outs)
    assert calls == [], "log-probabilities were computed for requests that asked for none"
    assert all(rows <= 1 for r in engine.step_records for _, _, rows in r.chunks), "extra LM-head rows"
    # beside a request that asks for its prompt's, the other keeps its single row
    engine = make_engine(loaded)
    engine.generate(prompts, [greedy(5, prompt_logprobs=0), greedy(5)])
    first = engine.step_records[0].chunks
    assert sorted(rows for _, _, rows in first) == [1, 30], "29 prompt rows and 1 sampling row; 1 for the other"
    assert calls == [29]


def test_gather_logprobs_in_slices_gives_what_one_pass_gives(monkeypatch):
    """A prompt's rows are gathered ROWS_AT_ONCE at a time (memory): the same values and ranks."""
    from minieng.wings import logprobs as lp

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(10, 40, generator=gen)
    ids, tops = list(range(10)), [3, 0, 5, 1, 2, 0, 4, 3, 2, 1]
    whole = lp.gather_logprobs(logits, ids, tops)
    monkeypatch.setattr(lp, "ROWS_AT_ONCE", 3)
    assert lp.gather_logprobs(logits, ids, tops) == whole


def test_a_whole_prompts_log_probabilities_are_not_copied_at_every_step(tiny_llama):
    """Once the prompt is computed its list no longer changes: every later output shares it (an
    echoed 4k-token prompt is not copied at each of its decode steps)."""
    engine = make_engine(tiny_llama[1])
    [prompt] = random_prompts([40], VOCAB, seed=5)
    engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, prompt_logprobs=1))
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    decoded = [o for o in outputs if o.prompt_logprobs is not None and len(o.prompt_logprobs) == 40]
    assert len(decoded) >= 3 and all(o.prompt_logprobs is decoded[0].prompt_logprobs for o in decoded)
