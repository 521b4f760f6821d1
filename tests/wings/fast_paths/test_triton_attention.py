"""The Triton paged decode kernel against the gather + SDPA reference (``attention.gather_decode_kv``
with ``decode_mask``), computed in fp32 from the same inputs.

Without a CUDA device the kernel runs on CPU tensors under Triton's interpreter. Triton 3.9 reads
``TRITON_INTERPRET`` whenever ``@triton.jit`` decorates a function, and decorates its own library
(``tl.sum``, ``tl.zeros``, ...) when it is imported: the variable must be set before triton is
first imported. This file sets it, which is enough when it runs alone; in a whole-suite run
``torch._dynamo`` (which imports triton when it is installed) is imported by earlier test modules,
so the variable must be set in ``tests/conftest.py``; without it the kernel's tests fail with that
explanation. With a GPU the same tests run on CUDA, compiled.

The cases are few (the interpreter runs every program in Python) but together cover: fp32, fp16
and bf16; GQA groups 1, 3, 4 and 7; head_dim 64 and 128; batch 1 and several; block sizes 4, 5,
8, 16 and 64 (a tile inside one block); contexts of 0 keys (a padded row), 1 key, ending
mid-block, an exact multiple of the block size, and longer than one tile of the kernel
(``BLOCK_N``); the keys split over 1 to 64 programs (flash-decoding), more splits than the
context has tiles included (empty splits); blocks in shuffled order, blocks shared between
sequences, padded tables; int32 and int64 indices; a strided q. Every slot no sequence attends
(the null block, unused blocks, tails of partly filled blocks) holds NaN when the kernel runs, and
so does the scratch the first stage writes its partial sums to, so a key read past a context, or
a split the combine reads without its having been written, shows up as NaN.

The split rule (``num_kv_splits``) is tested for its properties, and the warm-up for the variants
a run launches: Triton's own specialization code names each launch's compiled variant on the CPU
(``tests/triton_variants.py``), and every variant of an engine's run must have been launched by its warm-up.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():  # before triton is imported, if nothing imported it yet (see above)
    os.environ["TRITON_INTERPRET"] = "1"

pytest.importorskip("triton")

from minieng.wings.fast_paths import triton_attention  # noqa: E402
from minieng.core.attention import decode_mask, gather_decode_kv  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def require_runnable():
    """Fail (not skip: the kernel would go untested) when CPU tensors cannot run the kernel."""
    if DEVICE.type == "cpu" and not triton_attention.INTERPRETED:
        pytest.fail(
            "no CUDA device, and triton was imported before TRITON_INTERPRET=1 was set (torch._dynamo "
            "imports it): set TRITON_INTERPRET=1 in tests/conftest.py when CUDA is unavailable"
        )


def require_cpu_engine():
    """The tiny engines run on the CPU, where the kernels run only interpreted: without CUDA the
    interpreter is on (``require_runnable``); with it, these engine tests do not apply."""
    if DEVICE.type == "cuda":
        pytest.skip("the tiny test engines run on the CPU, and triton runs compiled on a CUDA machine")
    require_runnable()


# Against an fp32 reference from the same (rounded) inputs: fp16/bf16 differ by the kernel's
# rounding of the probabilities before P @ V and of the output.
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def make_batch(contexts, block_size, kv_heads, group, head_dim, dtype, index_dtype, seed):
    """q, a cache, block tables and context lengths for ``contexts`` (one sequence each).

    Blocks come from a shuffled pool; every sequence after the first whose context spans more
    than one block shares the first sequence's first block (a shared prompt prefix) when that one
    is full. Tables are padded with the null block (the pool's last) one column past the widest.
    """
    gen = torch.Generator().manual_seed(seed)
    needs = [-(-n // block_size) for n in contexts]
    num_blocks = sum(needs) + 2  # two blocks no table points at
    null = num_blocks
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    tables, taken = [], 0
    for i, n in enumerate(needs):
        share = i > 0 and n > 1 and contexts[0] >= block_size
        table = [tables[0][0]] if share else []
        table += perm[taken : taken + n - len(table)]
        taken += n - (1 if share else 0)
        tables.append(table)
    width = max(needs) + 1
    block_tables = torch.full((len(contexts), width), null, dtype=index_dtype)
    for i, table in enumerate(tables):
        block_tables[i, : len(table)] = torch.tensor(table, dtype=index_dtype)
    cache = torch.randn(num_blocks + 1, block_size, 2 * kv_heads, head_dim, generator=gen).to(dtype)
    cache[null] = 0
    q = torch.randn(len(contexts), kv_heads * group, head_dim, generator=gen).to(dtype)
    return q, cache, block_tables, torch.tensor(contexts, dtype=index_dtype)


def reference(q, cache, block_tables, context_lens):
    """fp32 gather + SDPA with ``decode_mask``, as ``attention.paged_attention`` decodes."""
    batch, num_heads, head_dim = q.shape
    kv_heads = cache.shape[2] // 2
    k, v = gather_decode_kv(cache.float(), block_tables.long().reshape(-1), batch)
    mask = decode_mask(context_lens.long(), k.shape[2])  # [batch, 1, 1, width * block_size]
    qd = q.float().view(batch, kv_heads, num_heads // kv_heads, head_dim)
    return F.scaled_dot_product_attention(qd, k, v, attn_mask=mask).reshape(batch, num_heads, head_dim)


def poison_unread(cache, block_tables, context_lens):
    """A copy of ``cache`` with NaN in every slot no sequence attends."""
    read = torch.zeros(cache.shape[:2], dtype=torch.bool)
    for table, n in zip(block_tables.long().tolist(), context_lens.tolist()):
        for pos in range(n):
            read[table[pos // cache.shape[1]], pos % cache.shape[1]] = True
    poisoned = cache.clone()
    poisoned[~read] = float("nan")
    return poisoned


@pytest.fixture
def nan_scratch(monkeypatch):
    """The first stage's scratch filled with NaN: a split the combine reads unwritten shows."""
    scratch = triton_attention._scratch

    def filled(*args):
        return tuple(t.fill_(float("nan")) for t in scratch(*args))

    monkeypatch.setattr(triton_attention, "_scratch", filled)


CASES = [
    # dtype, group, head_dim, kv_heads, block_size, contexts, index dtype, strided q, num_splits
    # (None: the rule's). BLOCK_N is 16 keys for fp32 and 32 for fp16/bf16.
    (torch.float32, 1, 64, 2, 16, [1], torch.int64, False, None),
    (torch.float32, 3, 128, 2, 5, [7, 1, 40], torch.int32, True, 3),  # 3 tiles over 3 splits; 7 and 1: 2 empty
    (torch.float32, 4, 64, 2, 8, [50, 0, 17], torch.int64, False, 2),  # 2 blocks a tile; a padded row
    (torch.float16, 4, 128, 2, 16, [33, 16, 1, 70], torch.int64, True, 2),  # 70 = 4 x 16 + 6: ends mid-block
    (torch.float16, 1, 64, 4, 8, [130], torch.int32, False, 16),  # 5 tiles, 11 empty splits
    (torch.float16, 3, 64, 2, 64, [100, 64, 7], torch.int64, False, 3),  # tiles inside a block
    (torch.bfloat16, 7, 64, 1, 16, [65, 3, 0], torch.int64, False, 4),
    (torch.bfloat16, 3, 128, 2, 4, [9, 64, 1], torch.int64, True, 5),
]


@pytest.mark.parametrize(
    "dtype, group, head_dim, kv_heads, block_size, contexts, index_dtype, strided, num_splits",
    CASES,
    ids=[f"{str(c[0])[6:]}-g{c[1]}-d{c[2]}-bs{c[4]}-b{len(c[5])}-s{c[8]}" for c in CASES],
)
def test_matches_gather_sdpa(
    nan_scratch, dtype, group, head_dim, kv_heads, block_size, contexts, index_dtype, strided, num_splits
):
    require_runnable()
    q, cache, tables, lens = make_batch(
        contexts, block_size, kv_heads, group, head_dim, dtype, index_dtype, seed=len(CASES)
    )
    expected = reference(q, cache, tables, lens)
    expected[lens == 0] = 0  # a context of no keys gives zeros (SDPA's fully masked row is NaN)
    if strided:  # q as a view with a head_dim stride of 2 (a slice of a wider tensor)
        wide = torch.zeros(*q.shape[:2], 2 * head_dim, dtype=dtype)
        wide[..., ::2] = q
        q = wide[..., ::2]
    cache = poison_unread(cache, tables, lens)
    args = [t.to(DEVICE) for t in (q, cache, tables, lens)]
    out = triton_attention.paged_decode_attention(*args, num_splits=num_splits)
    assert out.shape == q.shape and out.dtype == dtype and out.is_contiguous()
    torch.testing.assert_close(out.cpu().float(), expected, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


def test_every_split_count_gives_the_reference(nan_scratch):
    """One batch split over 1, 2, 3 and 64 programs a sequence (64: more splits than any context
    has tiles): the same output, the reference's, whatever the split."""
    require_runnable()
    q, cache, tables, lens = make_batch([45, 0, 16, 3], 8, 2, 2, 64, torch.float32, torch.int64, seed=1)
    expected = reference(q, cache, tables, lens)
    expected[1] = 0
    cache = poison_unread(cache, tables, lens)
    args = [t.to(DEVICE) for t in (q, cache, tables, lens)]
    outs = {n: triton_attention.paged_decode_attention(*args, num_splits=n).cpu() for n in (1, 2, 3, 64)}
    for n, out in outs.items():
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5, msg=f"num_splits={n}")


def test_the_split_count_depends_on_shapes_not_on_context_values():
    """A CUDA graph replays one grid whatever contexts its bucket brings: the plan's grid follows
    the batch, the KV heads and the table's width, never the context lengths' values."""
    q, cache, tables, lens = make_batch([5, 1], 4, 2, 2, 64, torch.float32, torch.int64, seed=0)
    wide = torch.zeros(2, 64, dtype=torch.long)  # a table of 64 blocks: room for 256 keys
    grids = {
        triton_attention.plan_decode(q, cache, wide, torch.tensor(n), None)[1][0].grid for n in ([1, 1], [256, 200])
    }
    assert len(grids) == 1
    (grid,) = grids
    assert grid[:2] == (2, 2) and grid[2] > 1  # 4 programs unsplit: fewer than the slots of INTERPRETER_SMS
    narrow = triton_attention.plan_decode(q, cache, tables, lens, None)[1][0].grid
    assert narrow[2] <= -(-tables.shape[1] * 4 // triton_attention.BLOCK_N[torch.float32])  # no more splits than tiles


@pytest.mark.parametrize(
    "programs, num_tiles, num_slots",
    [(8, 256, 264), (1, 256, 264), (8, 4, 264), (64, 1000, 264), (3, 64, 132), (105, 300, 132), (2, 30, 8)],
)
def test_num_kv_splits_follows_flash_attention_2s_rule(programs, num_tiles, num_slots):
    """No split once the programs fill 80 % of the slots; else the fewest splits, at most
    min(128, slots, tiles) and each changing the tiles a split gets, whose waves of programs are
    at least 85 % as full as the best count's."""
    n = triton_attention.num_kv_splits(programs, num_tiles, num_slots)
    if programs >= 0.8 * num_slots:
        assert n == 1
        return
    limit = min(triton_attention.MAX_SPLITS, num_slots, num_tiles)
    assert 1 <= n <= max(1, limit)
    eligible = [m for m in range(1, limit + 1) if m == 1 or -(-num_tiles // m) != -(-num_tiles // (m - 1))]
    assert n in eligible or limit < 1

    def fill(m):  # how full the waves of m splits are: the last one's share of a whole wave
        waves = programs * m / num_slots
        return waves / math.ceil(waves)

    best = max(fill(m) for m in eligible)
    assert fill(n) >= 0.85 * best
    assert all(fill(m) < 0.85 * best for m in eligible if m < n)  # the fewest that do


def test_num_kv_splits_fills_a_large_gpu_at_batch_1():
    """Batch 1 of 8 KV heads on 132 SMs (264 slots of 128-thread programs), 8k keys in 256 tiles:
    8 programs unsplit; 33 splits would fill the slots exactly, and 29 is the fewest filling 85 %
    of them (8 x 29 = 232 >= 0.85 x 264 = 224.4; 28 splits deal 10 tiles each, 29 deal 9)."""
    assert triton_attention.num_kv_splits(8, 256, 264) == 29


def test_num_kv_splits_refuses_what_it_cannot_count():
    for args in ((0, 10, 8), (1, 10, 0), (1, -1, 8)):
        with pytest.raises(ValueError, match="must be >= 1"):
            triton_attention.num_kv_splits(*args)
    q, cache, tables, lens = make_batch([5, 3], 4, 2, 2, 64, torch.float32, torch.int64, seed=0)
    with pytest.raises(ValueError, match="num_splits must be an int >= 1"):
        triton_attention.plan_decode(q, cache, tables, lens, 0)


def test_empty_context_gives_zeros_and_empty_batch_runs_nothing():
    require_runnable()
    q, cache, tables, lens = make_batch([5, 1], 4, 2, 2, 64, torch.float32, torch.int64, seed=0)
    lens[1] = 0  # a padded row of a batch
    out = triton_attention.paged_decode_attention(*[t.to(DEVICE) for t in (q, cache, tables, lens)]).cpu()
    torch.testing.assert_close(out[0], reference(q, cache, tables, lens)[0], atol=1e-5, rtol=1e-5)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    empty = triton_attention.paged_decode_attention(*[t.to(DEVICE) for t in (q[:0], cache, tables[:0], lens[:0])])
    assert empty.shape == (0, *q.shape[1:])


def _bad_inputs():
    q, cache, tables, lens = make_batch([5, 3], 4, 2, 2, 64, torch.float32, torch.int64, seed=0)
    odd_cache = torch.zeros(*cache.shape[:3], 48)
    yield "head_dim 48", (q[..., :48], odd_cache, tables, lens)
    yield "head_dim mismatch", (q[..., :32], cache, tables, lens)
    yield "dtypes differ", (q.half(), cache, tables, lens)
    yield "integer q", (q.long(), cache.long(), tables, lens)
    yield "heads not a multiple of kv_heads", (q[:, :3], cache, tables, lens)
    yield "q not 3-D", (q[None], cache, tables, lens)
    yield "odd 2 * kv_heads", (q, cache[:, :, :3], tables, lens)
    yield "table batch", (q, cache, tables[:1], lens)
    yield "float table", (q, cache, tables.float(), lens)
    yield "context_lens shape", (q, cache, tables, lens[:, None])
    yield "devices differ", (q, cache, tables.to("meta"), lens)


@pytest.mark.parametrize("name, args", list(_bad_inputs()), ids=[name for name, _ in _bad_inputs()])
def test_bad_input_raises_value_error(name, args):
    with pytest.raises(ValueError):
        triton_attention.paged_decode_attention(*[t if t.is_meta else t.to(DEVICE) for t in args])


def test_imports_without_triton():
    code = (
        "import sys; sys.modules['triton'] = None\n"  # import triton raises ImportError
        "from minieng.wings.fast_paths import triton_attention as t\n"
        "assert not t.TRITON_AVAILABLE and not t.INTERPRETED\n"
        "import torch\n"
        "try:\n"
        "    t.paged_decode_attention(*(torch.zeros(1, dtype=torch.long),) * 4)\n"
        "except RuntimeError as e:\n"
        "    assert 'needs triton' in str(e)\n"
        "else:\n"
        "    raise AssertionError('no RuntimeError')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_an_engine_with_the_triton_backend_decodes_the_reference_engines_tokens(tiny_llama, monkeypatch):
    """attention_backend="triton" (interpreted on this CPU): every decode step attends through the
    kernels, prefill chunks through SDPA, and the greedy tokens are the gather path's. The split
    rule is given 64 SMs' slots, so the keys are split too."""
    require_cpu_engine()
    from helpers import make_engine, random_prompts

    import minieng.wings.fast_paths.triton_attention as ta
    from minieng import SamplingParams

    monkeypatch.setattr(ta, "INTERPRETER_SMS", 64)
    calls, splits = [], []
    kernel, launch = ta.paged_decode_attention, ta.Launch.__call__
    monkeypatch.setattr(ta, "paged_decode_attention", lambda *a, **k: calls.append(a[0].shape[0]) or kernel(*a, **k))
    monkeypatch.setattr(ta.Launch, "__call__", lambda self: splits.append(self.grid[-1]) or launch(self))

    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    prompts = random_prompts([3, 12, 21, 7], tiny_llama[1].model.config.vocab_size, seed=8)
    reference = make_engine(tiny_llama[1], max_num_seqs=4).generate(prompts, params)
    engine = make_engine(tiny_llama[1], max_num_seqs=4, attention_backend="triton")
    calls.clear()  # the warm-up's
    splits.clear()
    assert [o.token_ids for o in engine.generate(prompts, params)] == [o.token_ids for o in reference]
    layers = tiny_llama[1].model.config.num_hidden_layers
    assert len(calls) >= 9 * layers and max(calls) == 4  # every decode step, the four sequences at once
    split_grids = splits[::2]  # a split launch, then its combine
    assert max(split_grids) > 1


def test_the_warm_up_launches_every_kernel_variant_a_run_launches(tiny_llama, monkeypatch):
    """Triton compiles a variant per specialization of a launch's arguments (an int equal to 1 or
    divisible by 16, a 16-byte aligned pointer): each new one mid-run costs a compile. Every launch
    of a run, eager steps of batch 1 to 3 and table widths 1 to 9 blocks, and steps on the CUDA
    graphs' static buffers (replayed eagerly here), is named by Triton's own specialization code
    for an sm_90 GPU (``tests/triton_variants.py``): each variant was launched by the engine's warm-up. The run
    must meet what would otherwise be new variants: a width of 1 block and of several, splits of 1
    and of several, the graphs' context lengths at an address not 16-byte aligned."""
    require_cpu_engine()
    from helpers import make_engine, random_prompts

    import minieng.wings.fast_paths.triton_attention as ta
    from minieng import SamplingParams
    from minieng.wings.fast_paths.cuda_graph import DecodeGraphs
    from triton_variants import variant_key

    monkeypatch.setattr(ta, "INTERPRETER_SMS", 16)  # batch 3 of 2 KV heads splits; batch 1 more so
    launches = []
    launch = ta.Launch.__call__

    def record(self):
        launches.append((variant_key(self), self.args))
        return launch(self)

    monkeypatch.setattr(ta.Launch, "__call__", record)
    engine = make_engine(tiny_llama[1], max_num_seqs=3, attention_backend="triton")
    warm = {key for key, _ in launches}
    assert len(warm) == 2  # the split kernel's and the combine's
    launches.clear()

    vocab = tiny_llama[1].model.config.vocab_size
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    short = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    engine.generate(random_prompts([2], vocab, seed=4), short)  # eager steps: 1 block, batch 1
    engine.generate(random_prompts([2, 30, 9], vocab, seed=5), params)  # up to 9 blocks, batch 3
    graphs = DecodeGraphs(
        engine.model, engine.kv_cache, 3, engine.max_model_len, 1 << 30, capture=False, attention_backend="triton"
    )
    engine.runner.fast.graphs = graphs
    engine.generate(random_prompts([5, 3], vocab, seed=6), params)  # on the static buffers
    assert engine.runner.last_forward_path == "cuda_graph"

    split_args = [args for key, args in launches if key.startswith("_split_kernel")]
    widths = {args[16] for args in split_args}  # max_blocks: the table's width
    assert 1 in widths and max(widths) > 1
    assert {args[17] > 1 for args in split_args} == {True, False}  # num_splits
    assert any(args[3].data_ptr() % 16 for args in split_args)  # the graphs' context lengths
    assert {key for key, _ in launches} <= warm

    # A launch that does differ in what Triton specializes gets a variant of its own.
    pool = engine.kv_cache.layers[0].blocks
    q = torch.zeros(1, 4, pool.shape[3])
    int32_tables = torch.full((1, 1), engine.kv_cache.null_block, dtype=torch.int32)
    _, other = ta.plan_decode(q, pool, int32_tables, torch.ones(1, dtype=torch.long))
    assert variant_key(other[0]) not in warm


def test_the_triton_backend_is_refused_where_it_cannot_run(tiny_llama, monkeypatch):
    from helpers import make_engine

    import minieng.wings.fast_paths.triton_attention as ta

    monkeypatch.setattr(ta, "INTERPRETED", False)
    with pytest.raises(ValueError, match="attention_backend='triton': a CPU runs Triton kernels only under"):
        make_engine(tiny_llama[1], attention_backend="triton")
    with pytest.raises(ValueError, match="use 'sdpa' or 'triton'"):
        make_engine(tiny_llama[1], attention_backend="flash")


@pytest.mark.parametrize("capability, refused", [((7, 5), True), ((8, 0), False), ((9, 0), False)])
def test_the_triton_backend_is_refused_below_sm_80(monkeypatch, capability, refused):
    """A T4 (sm_75) has no tensor-core mma for the kernel's tl.dot: refused, saying so; sm_80 and
    later pass (the device is only named: nothing runs on it)."""
    from minieng.wings.fast_paths.forward_paths import check_attention_backend

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    cuda = torch.device("cuda", 0)
    if refused:
        with pytest.raises(ValueError, match="sm_75: below sm_80 .* use attention_backend='sdpa'"):
            check_attention_backend("triton", 64, cuda)
    else:
        check_attention_backend("triton", 64, cuda)
    check_attention_backend("sdpa", 64, cuda)  # the other backend runs everywhere
