"""The GPU path's machinery, tested on a CPU: CUDA-graph buckets, static buffers and padding,
masked KV slots that cannot poison attention, non-contiguous attention outputs, non-finite
logits, and a KV pool sized from the device.

``DecodeGraphs(capture=False)`` keeps every bucket and static buffer and runs the forward eagerly
on them, so its bucketing and padding give the same tokens as the plain path here; only the
capture itself needs CUDA (the last test, skipped without a GPU).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from helpers import make_engine, random_prompts

from minieng import EngineConfig, LLMEngine, SamplingParams
from minieng.wings.fast_paths.cuda_graph import DecodeGraphs, capture_batch_sizes, capture_widths, smallest_at_least
from minieng.wings.gpu_memory.memory_plan import kv_blocks_for_bytes, kv_budget_bytes
from minieng.core.model_runner import NonFiniteLogitsError
from minieng.core import attention

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def install_graphs(engine: LLMEngine, max_gather_tokens: int = 1 << 30) -> DecodeGraphs:
    """The engine's decode graphs as a GPU builds them (query lengths 1 .. k + 1), replayed eagerly."""
    query_lens = tuple(range(1, engine.config.num_speculative_tokens + 2))
    graphs = DecodeGraphs(
        engine.model,
        engine.kv_cache,
        engine.config.max_num_seqs,
        engine.max_model_len,
        max_gather_tokens,
        query_lens,
        capture=False,
    )
    engine.runner.fast.graphs = graphs
    return graphs


def graphed_steps(engine: LLMEngine) -> list[bool]:
    """Run the engine's queue to completion; whether each step replayed a graph."""
    flags = []
    while engine.has_unfinished_requests():
        engine.step()
        flags.append((engine.runner.last_forward_path == "cuda_graph"))
    return flags


# -- buckets --------------------------------------------------------------------------------------


@pytest.mark.parametrize("max_num_seqs", [1, 2, 12, 64, 100, 600])
def test_every_batch_size_has_a_bucket_at_least_as_large(max_num_seqs):
    sizes = capture_batch_sizes(max_num_seqs)
    assert sizes == sorted(set(sizes)) and sizes[0] == 1 and sizes[-1] == max_num_seqs
    for b in range(1, max_num_seqs + 1):
        bucket = smallest_at_least(sizes, b)
        assert bucket is not None and b <= bucket <= max(2 * b - 1, 1) or bucket == max_num_seqs
    assert smallest_at_least(sizes, max_num_seqs + 1) is None


@pytest.mark.parametrize("max_blocks", [1, 5, 8, 9, 64, 513])
def test_every_width_has_a_bucket(max_blocks):
    widths = capture_widths(max_blocks)
    assert widths == sorted(set(widths)) and widths[-1] == max_blocks
    assert all(smallest_at_least(widths, w) >= w for w in range(1, max_blocks + 1))


@pytest.mark.parametrize("bad", [0, -3])
def test_bucket_helpers_refuse_empty_ranges(bad):
    with pytest.raises(ValueError, match="must be >= 1"):
        capture_batch_sizes(bad)
    with pytest.raises(ValueError, match="must be >= 1"):
        capture_widths(bad)


def test_buckets_beyond_the_gather_budget_are_not_captured(tiny_llama):
    engine = make_engine(tiny_llama[1], max_num_seqs=12)  # block_size 4, max_model_len 256: 64 blocks
    graphs = install_graphs(engine, max_gather_tokens=4 * 16 * 4)
    assert (1, 4, 16) in graphs.buckets and (1, 8, 16) not in graphs.buckets and (1, 4, 32) not in graphs.buckets
    assert graphs.bucket(1, 3, 10) == (1, 4, 16)
    assert graphs.bucket(1, 5, 2) == (1, 8, 8) and graphs.bucket(1, 5, 10) is None
    assert graphs.bucket(1, 13, 1) is None  # more rows than max_num_seqs
    assert graphs.bucket(2, 1, 1) is None  # no speculative decoding: only single-token steps


def test_the_triton_backend_captures_its_one_query_buckets_whatever_the_gather_budget(tiny_llama):
    """Triton reads one query's keys in place: no gather to budget. A verification step's k + 1
    queries still gather, so its buckets keep the budget."""
    engine = make_engine(tiny_llama[1], max_num_seqs=12)
    graphs = DecodeGraphs(
        engine.model, engine.kv_cache, 12, engine.max_model_len, 4 * 16 * 4, (1, 2), capture=False,
        attention_backend="triton",
    )  # fmt: skip
    assert (1, 8, 16) in graphs.buckets and (1, 16, 64) not in graphs.buckets  # 16 > max_num_seqs' 12
    assert (1, 12, 64) in graphs.buckets  # the widest, at the largest batch
    assert (2, 4, 16) in graphs.buckets and (2, 8, 16) not in graphs.buckets


# -- replays on static buffers give the plain path's tokens ---------------------------------------


@pytest.mark.parametrize("max_num_seqs,lengths", [(12, [5, 9, 17, 30, 3, 11, 40]), (3, [7, 20, 2]), (12, [60] * 12)])
def test_static_buffer_decode_equals_the_plain_path(tiny_llama, max_num_seqs, lengths):
    loaded = tiny_llama[1]
    prompts = random_prompts(lengths, loaded.model.config.vocab_size, seed=3)
    plain = make_engine(loaded, max_num_seqs=max_num_seqs).generate(prompts, GREEDY)
    engine = make_engine(loaded, max_num_seqs=max_num_seqs)
    install_graphs(engine)
    for p in prompts:
        engine.add_request(p, GREEDY)
    flags = graphed_steps(engine)
    assert sum(flags) >= GREEDY.max_tokens - 2, "decode steps should replay the static-buffer forward"
    for i, out in enumerate(plain):
        assert engine.output(str(i)).token_ids == out.token_ids


def test_blocks_wider_than_any_bucket_fall_back_to_eager(tiny_llama):
    loaded = tiny_llama[1]
    prompts = random_prompts([6, 70], loaded.model.config.vocab_size, seed=4)
    plain = make_engine(loaded).generate(prompts, GREEDY)
    engine = make_engine(loaded)
    graphs = install_graphs(engine, max_gather_tokens=2 * 8 * 4)  # 64 tokens: (1, 16) and (2, 8) at most
    assert max(w for _, _, w in graphs.buckets) == 16 and max(b for _, b, _ in graphs.buckets) == 2
    for p in prompts:
        engine.add_request(p, GREEDY)
    assert not any(graphed_steps(engine)), "the 70-token prompt needs more than 8 blocks"
    assert [engine.output(str(i)).token_ids for i in range(2)] == [o.token_ids for o in plain]
    engine.add_request(prompts[0], GREEDY, request_id="short")
    assert any(graphed_steps(engine))
    assert engine.output("short").token_ids == plain[0].token_ids


def test_padded_rows_write_only_the_scratch_slot(tiny_llama):
    """Three decodes in a bucket of four: the step changes the real rows' slots and the scratch
    slot, nothing else; the null block, which padded block tables read, stays all zeros."""
    loaded = tiny_llama[1]
    engine = make_engine(loaded, max_num_seqs=4)
    install_graphs(engine)
    for p in random_prompts([5, 9, 13], loaded.model.config.vocab_size, seed=5):
        engine.add_request(p, GREEDY)
    engine.step()  # prefill: eager
    running = list(engine.scheduler.running)
    k_before = engine.kv_cache.k.clone()
    engine.step()  # three decodes, padded to four
    assert engine.runner.last_forward_path == "cuda_graph"
    cache, bs = engine.kv_cache, engine.kv_cache.block_size
    changed = (cache.k != k_before).any(dim=(0, 3, 4)).flatten().nonzero().flatten().tolist()
    real = {seq.block_table[p // bs] * bs + p % bs for seq in running for p in [seq.num_computed_tokens - 1]}
    assert set(changed) <= real | {cache.scratch_slot}
    assert real <= set(changed) and cache.scratch_slot in changed
    assert not cache.k[:, cache.null_block].any() and not cache.v[:, cache.null_block].any()
    assert cache.scratch_block not in {b for seq in running for b in seq.block_table}


@pytest.mark.parametrize("poison", [float("nan"), float("inf")])
def test_what_padding_rows_write_never_reaches_a_later_step(tiny_llama, monkeypatch, poison):
    """fp16 on a GPU: a padding row (token 0 at position 0) can compute a NaN, and its K/V is
    written somewhere. Here every K/V a padding row writes is replaced by ``poison``: it must land
    where no block table reads, so that later batched steps neither raise NonFiniteLogitsError
    nor change a token."""
    import minieng.core.llama as model_module

    loaded = tiny_llama[1]
    prompts = random_prompts([5, 9, 13], loaded.model.config.vocab_size, seed=5)
    reference = make_engine(loaded, max_num_seqs=4).generate(prompts, GREEDY)
    engine = make_engine(loaded, max_num_seqs=4)
    install_graphs(engine)
    real_slots = engine.kv_cache.num_blocks * engine.kv_cache.block_size  # slots of allocatable blocks
    write_kv = model_module.write_kv

    def padding_writes_poison(layer, kv, slot_mapping):
        pad = slot_mapping >= real_slots  # rows writing outside every allocatable block: padding
        write_kv(layer, torch.where(pad[:, None, None, None], poison, kv), slot_mapping)

    monkeypatch.setattr(model_module, "write_kv", padding_writes_poison)
    for p in prompts:
        engine.add_request(p, GREEDY)
    flags = graphed_steps(engine)  # three sequences in a bucket of four: a padding row every step
    assert sum(flags) >= GREEDY.max_tokens - 2
    assert [engine.output(str(i)).token_ids for i in range(3)] == [o.token_ids for o in reference]


# -- masked slots never reach the output (issue 8, item 5) ----------------------------------------


@pytest.mark.parametrize("poison", [float("nan"), float("inf")])
@pytest.mark.parametrize("graphed", [False, True])
def test_poisoned_free_blocks_and_tails_do_not_change_outputs(tiny_llama, poison, graphed):
    """Every block the manager can hand out starts as NaN or inf: padding of decode block tables,
    the never-written tail of each last block, and blocks reused after others finish must all be
    masked or zeroed before they meet a product."""
    loaded = tiny_llama[1]
    prompts = random_prompts([3, 14, 6, 21], loaded.model.config.vocab_size, seed=6)
    reference = make_engine(loaded).generate(prompts, GREEDY)
    engine = make_engine(loaded, num_kv_blocks=64)
    if graphed:
        install_graphs(engine)
    pool = slice(0, engine.kv_cache.num_blocks)  # every block but the null block
    engine.kv_cache.k[:, pool] = poison
    engine.kv_cache.v[:, pool] = poison
    outs = engine.generate(prompts, GREEDY)
    assert [o.token_ids for o in outs] == [o.token_ids for o in reference]
    # Free blocks poisoned again (those the prefix cache keeps hold real KV), then reused by a
    # second wave.
    bm = engine.block_manager
    for block in range(engine.kv_cache.num_blocks):
        if bm.ref_counts[block] == 0 and bm.block_keys[block] is None:
            engine.kv_cache.v[:, block] = poison
    outs = engine.generate(prompts, GREEDY)
    assert [o.token_ids for o in outs] == [o.token_ids for o in reference]


# -- attention outputs that are not contiguous (fp32 on CUDA) --------------------------------------


def test_non_contiguous_sdpa_output_is_handled(tiny_llama, monkeypatch):
    loaded = tiny_llama[1]
    prompts = random_prompts([5, 12, 8], loaded.model.config.vocab_size, seed=7)
    reference = make_engine(loaded).generate(prompts, GREEDY)
    original = attention.F.scaled_dot_product_attention
    seen = []

    def strided(*args, **kwargs):
        out = original(*args, **kwargs)
        out = out.transpose(-1, -2).contiguous().transpose(-1, -2)  # same values, not contiguous
        seen.append(out.is_contiguous())
        return out

    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", strided)
    outs = make_engine(loaded).generate(prompts, GREEDY)
    assert seen and not any(seen)
    assert [o.token_ids for o in outs] == [o.token_ids for o in reference]


# -- non-finite logits stop with the dtype's name -------------------------------------------------


def test_overflowing_float16_stops_with_a_clear_error(tiny_llama):
    import copy

    from minieng.model.loader import LoadedModel

    loaded = tiny_llama[1]
    model = copy.deepcopy(loaded.model).half()
    with torch.no_grad():
        model.norm.weight.fill_(3e4)  # the final hidden state overflows float16 in the LM head
    engine = make_engine(LoadedModel(model, None, loaded.hf_config, set(), None))
    engine.add_request([1, 2, 3], GREEDY)
    with pytest.raises(NonFiniteLogitsError, match=r"float16.*bfloat16"):
        engine.step()


# -- the KV pool -----------------------------------------------------------------------------------


def test_kv_budget_arithmetic():
    gib = 1024**3
    # 80 GiB x 0.9 = 72; less 20 GiB of weights and activations and 1 GiB outside torch.
    assert kv_budget_bytes(80 * gib, 0.9, 20 * gib, gib) == int(72 * gib) - 21 * gib
    assert kv_budget_bytes(8 * gib, 0.5, 5 * gib, 0) < 0
    # A draft's pool has as many blocks as the target's: both per-token sizes share the budget.
    assert kv_blocks_for_bytes(16 * 1000 * 30, 16, [1000]) == 30
    assert kv_blocks_for_bytes(16 * 1000 * 30, 16, [1000, 500]) == 20
    assert kv_blocks_for_bytes(-5, 16, [1000]) == 0


# -- the eager decode step's gathered K/V stays within its budget (issue 19, item 3) ---------------


def test_an_eager_decode_batch_gathers_no_more_than_its_budget(tiny_llama, monkeypatch):
    """Batches too wide to capture run eagerly, and theirs is the largest gathered K/V copy. With a
    budget of two sequences' width, every decode gather holds at most that many keys, the batch is
    attended in groups, and the tokens are the unlimited engine's."""
    loaded = tiny_llama[1]
    prompts = random_prompts([30, 9, 17, 25, 3, 12, 21], loaded.model.config.vocab_size, seed=10)
    reference = make_engine(loaded, max_num_seqs=8).generate(prompts, GREEDY)
    engine = make_engine(loaded, max_num_seqs=8)
    bs = engine.kv_cache.block_size
    budget = 2 * -(-(30 + GREEDY.max_tokens) // bs) * bs  # two of the widest sequence's block tables
    engine.runner.max_gather_tokens = budget
    gathered = []  # keys per decode gather (the batch's block tables, flattened)
    gather = attention.gather_decode_kv

    def spy(cache, block_ids, batch):
        gathered.append(block_ids.numel() * bs)
        return gather(cache, block_ids, batch)

    monkeypatch.setattr(attention, "gather_decode_kv", spy)
    outs = engine.generate(prompts, GREEDY)
    assert [o.token_ids for o in outs] == [o.token_ids for o in reference]
    assert gathered and max(gathered) <= budget
    layers = loaded.model.config.num_hidden_layers
    assert len(gathered) > 2 * layers * (GREEDY.max_tokens - 1), "seven decodes at a time should be split"


def test_the_gather_budget_groups_a_t4_batch_into_the_memory_kept_for_it():
    """The issue's case: SmolLM2-1.7B's shape in fp16 on a T4 (15 GiB), 64 sequences of 8k context.
    Ungrouped, one layer's gathered K/V is 4.3 GB; grouped, it fits half the scratch kept out of
    the KV pool, whatever the batch."""
    from minieng.wings.gpu_memory.kv_sizing import GATHER_SCRATCH_FRACTION, gather_budget_for
    from minieng.core.attention import decode_group_size

    total = 15 * 1024**3
    per_layer_token_bytes = 2 * 32 * 64 * 2  # K and V, 32 KV heads x head_dim 64, fp16
    pool_tokens = 400_000
    budget = gather_budget_for(total, per_layer_token_bytes, pool_tokens)
    width = 8192
    assert 64 * width * per_layer_token_bytes > 4e9  # what an ungrouped step would copy
    group = decode_group_size(64, width, budget)
    assert group is not None and 1 <= group < 64
    assert group * width * per_layer_token_bytes <= GATHER_SCRATCH_FRACTION * total / 2
    assert decode_group_size(2, width, budget) is None  # a batch that fits is attended whole
    assert decode_group_size(3, 10 * budget, budget) == 1  # never fewer than one sequence
    assert gather_budget_for(total, per_layer_token_bytes, 1000) == 1000  # never more than the pool


def test_the_gather_scratch_is_kept_out_of_the_pool_with_or_without_graphs(tiny_llama, monkeypatch):
    """enforce_eager runs every decode eagerly, gathering as much as a graph would: the KV pool
    sized from the device keeps the same scratch out (simulated: the device's sizing replaced)."""
    import minieng.wings.gpu_memory.kv_sizing as kv_sizing

    seen = []
    monkeypatch.setattr(
        kv_sizing,
        "device_kv_blocks",
        lambda *args, **kw: seen.append(args[4] if len(args) > 4 else kw["reserve_fraction"]) or 100,
    )
    for eager in (False, True):
        config = EngineConfig(device="cpu", max_model_len=256, enforce_eager=eager)
        assert kv_sizing.device_sized_kv_blocks(config, [tiny_llama[1].model], 256) == 100
    assert seen == [kv_sizing.GATHER_SCRATCH_FRACTION] * 2


def test_default_max_model_len_is_capped_to_the_pool(tiny_llama):
    loaded = tiny_llama[1]  # a context of 256 tokens
    with pytest.warns(UserWarning, match=r"capped to 48"):
        engine = LLMEngine(EngineConfig(device="cpu", block_size=16, num_kv_blocks=3), loaded=loaded)
    assert engine.max_model_len == 48
    out = engine.generate([[1] * 40], SamplingParams(temperature=0, max_tokens=50, ignore_eos=True))[0]
    assert len(out.token_ids) == 8 and out.finish_reason == "length"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        LLMEngine(EngineConfig(device="cpu", block_size=16, num_kv_blocks=16), loaded=loaded)  # fits: no warning


# -- the capture itself (a GPU only) ----------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graph capture needs a CUDA GPU")
def test_captured_graphs_equal_eager_on_cuda(tiny_llama):
    import copy

    from minieng.model.loader import LoadedModel

    loaded = tiny_llama[1]
    model = copy.deepcopy(loaded.model).cuda()
    cuda_loaded = LoadedModel(model, None, loaded.hf_config, set(), None)
    prompts = random_prompts([5, 9, 17, 30, 3], loaded.model.config.vocab_size, seed=8)
    fields = dict(device="cuda", block_size=4, num_kv_blocks=256, max_model_len=256, max_num_seqs=12)
    eager = LLMEngine(EngineConfig(**fields, enforce_eager=True), loaded=cuda_loaded).generate(prompts, GREEDY)
    engine = LLMEngine(EngineConfig(**fields), loaded=cuda_loaded)
    assert engine.runner.fast.graphs is not None and engine.runner.fast.graphs.num_graphs > 0
    for p in prompts:
        engine.add_request(p, GREEDY)
    assert any(graphed_steps(engine))
    for i, out in enumerate(eager):
        assert engine.output(str(i)).token_ids == out.token_ids


def test_speculative_decoding_through_static_buffers_equals_plain_greedy(tiny_llama):
    """Target verification steps stay eager (k + 1 tokens); the draft model's single-token steps
    replay the static-buffer forward. Greedy output must still equal plain greedy output."""
    loaded = tiny_llama[1]
    prompts = random_prompts([7, 19, 4], loaded.model.config.vocab_size, seed=9)
    plain = make_engine(loaded, max_num_seqs=4).generate(prompts, GREEDY)
    engine = make_engine(loaded, max_num_seqs=4, speculative_method="draft", num_speculative_tokens=3)
    install_graphs(engine)
    drafter = engine.drafter
    drafter.runner.fast.graphs = DecodeGraphs(
        drafter.model, drafter.kv_cache, 4, engine.max_model_len, 1 << 30, capture=False
    )
    outs = engine.generate(prompts, GREEDY)
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    assert drafter.runner.last_forward_path == "cuda_graph"
    verify_steps = [r for r in engine.step_records if r.num_prefill_tokens == 0 and any(n > 1 for n, _, _ in r.chunks)]
    assert verify_steps and all(
        r.forward_path == "cuda_graph" for r in verify_steps if len({n for n, _, _ in r.chunks}) == 1
    ), "a verification step whose sequences all carry k + 1 tokens replays a graph"


@pytest.mark.parametrize("q_len,context_len", [(1, 5), (3, 7), (4, 4), (6, 30)])
def test_causal_lower_right_equals_the_explicit_offset_mask(q_len, context_len):
    """CUDA runs chunks over cached context with torch's ``causal_lower_right``; CPUs with the
    explicit mask. Both must select the same keys."""
    from torch.nn.attention.bias import causal_lower_right

    gen = torch.Generator().manual_seed(q_len * 100 + context_len)
    q = torch.randn(1, 4, q_len, 8, generator=gen)
    k, v = torch.randn(2, 1, 4, context_len, 8, generator=gen)
    explicit = attention.offset_causal_mask(q_len, context_len, torch.device("cpu"))
    assert explicit.shape == (q_len, context_len) and bool(explicit[-1].all())
    a = attention.F.scaled_dot_product_attention(q, k, v, attn_mask=explicit)
    b = attention.F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(q_len, context_len))
    assert torch.allclose(a, b, atol=1e-6)


# -- the step's layout ------------------------------------------------------------------------------


def test_block_table_tensor_pads_with_the_null_block():
    from minieng.core.attention import block_table_tensor

    t = block_table_tensor([[3, 7, 1], [], [5]], 4, null_block=99)
    assert t.tolist() == [[3, 7, 1, 99], [99, 99, 99, 99], [5, 99, 99, 99]] and t.dtype == torch.long


def test_sequence_token_ids_slices_prompt_and_output():
    from minieng.core.sequence import Sequence

    seq = Sequence("s", [10, 11, 12], SamplingParams(), 0.0)
    seq.output_token_ids += [20, 21]
    for start in range(6):
        for end in range(start, 6):
            assert seq.token_ids(start, end) == seq.all_token_ids[start:end]


def test_profile_step_fits_a_budget_longer_than_the_context(tiny_llama):
    """The KV sizing profile runs ``max_num_batched_tokens`` tokens; with a budget beyond the RoPE
    table (max_model_len) it must split them into sequences the table covers (a CUDA device-side
    assert otherwise). The same layout runs here on the CPU."""
    from minieng.core.model_runner import profile_step
    from minieng.core.attention import build_metadata
    from minieng.core.kv_cache import KVCache

    model = tiny_llama[1].model
    longest = model.rope.max_position  # 256
    slots, chunks, positions, num_blocks = profile_step(600, longest, 16)
    assert [n for n, _, _ in chunks] == [256, 256, 88] and max(positions) == longest - 1
    assert len(slots) == len(set(slots)) == 600 and max(slots) < num_blocks * 16
    cache = KVCache(model.config, num_blocks, 16, torch.float32, "cpu")
    meta = build_metadata(slots, [], chunks, 16, cache.null_block, torch.device("cpu"))
    logits = model(torch.zeros(600, dtype=torch.long), torch.tensor(positions), cache, meta, torch.tensor([599]))
    assert logits.shape == (1, model.config.vocab_size) and bool(torch.isfinite(logits).all())


@pytest.mark.parametrize("query_len", [1, 2, 5])
def test_multi_query_decode_attention_equals_the_chunk_path(query_len):
    """A step whose sequences all run ``query_len`` tokens is attended as one batched decode
    (a CUDA graph on a GPU); it must equal attending each sequence's chunk on its own."""
    from minieng.core.attention import build_metadata, paged_attention

    gen = torch.Generator().manual_seed(query_len)
    blocks, bs, kv_heads, heads, dim = 24, 4, 2, 6, 8
    cache = torch.randn(blocks + 1, bs, 2 * kv_heads, dim, generator=gen)  # K heads, then V heads
    tables, ctx = [[3, 7, 1], [5, 2], [9, 11, 0, 4]], [11, 6, 15]
    q = torch.randn(len(tables) * query_len, heads, dim // 2, 2, generator=gen)  # RoPE's pair layout
    slots = [0] * len(q)  # unused by attention itself
    as_decodes = build_metadata(slots, list(zip(tables, ctx)), [], bs, blocks, torch.device("cpu"), query_len)
    as_chunks = build_metadata(
        slots, [], [(query_len, t, c) for t, c in zip(tables, ctx)], bs, blocks, torch.device("cpu")
    )
    a = paged_attention(q, cache, as_decodes)
    b = paged_attention(q, cache, as_chunks)
    assert torch.allclose(a, b, atol=1e-5), (a - b).abs().max()
