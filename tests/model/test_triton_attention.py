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
and bf16; GQA groups 1, 3, 4 and 8; head_dim 64 and 128; batch 1 and several; block sizes 4, 5,
8 and 16; contexts of 1 key, not a multiple of the block size, an exact multiple, and longer than
one tile of the kernel (``BLOCK_N``); blocks in shuffled order, blocks shared between sequences,
padded tables; int32 and int64 indices; a strided q. Every slot no sequence attends (the null
block, unused blocks, tails of partly filled blocks) holds NaN when the kernel runs, so a key read
past a context shows up as NaN.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():  # before triton is imported, if nothing imported it yet (see above)
    os.environ["TRITON_INTERPRET"] = "1"

pytest.importorskip("triton")

from minieng.model import triton_attention  # noqa: E402
from minieng.model.attention import decode_mask, gather_decode_kv  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def require_runnable():
    """Fail (not skip: the kernel would go untested) when CPU tensors cannot run the kernel."""
    if DEVICE.type == "cpu" and not triton_attention.INTERPRETED:
        pytest.fail(
            "no CUDA device, and triton was imported before TRITON_INTERPRET=1 was set (torch._dynamo "
            "imports it): set TRITON_INTERPRET=1 in tests/conftest.py when CUDA is unavailable"
        )


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


CASES = [
    # dtype, group, head_dim, kv_heads, block_size, contexts, index dtype, strided q
    (torch.float32, 1, 64, 2, 16, [1], torch.int64, False),
    (torch.float32, 3, 128, 2, 5, [7, 1, 40], torch.int32, True),
    (torch.float16, 4, 128, 2, 16, [33, 16, 1, 70], torch.int64, True),
    (torch.float16, 1, 64, 4, 8, [130], torch.int32, False),
    (torch.bfloat16, 8, 64, 1, 16, [65, 3], torch.int64, False),
    (torch.bfloat16, 3, 128, 2, 4, [9, 64, 1], torch.int64, True),
]


@pytest.mark.parametrize(
    "dtype, group, head_dim, kv_heads, block_size, contexts, index_dtype, strided",
    CASES,
    ids=[f"{str(c[0])[6:]}-g{c[1]}-d{c[2]}-bs{c[4]}-b{len(c[5])}" for c in CASES],
)
def test_matches_gather_sdpa(dtype, group, head_dim, kv_heads, block_size, contexts, index_dtype, strided):
    require_runnable()
    q, cache, tables, lens = make_batch(
        contexts, block_size, kv_heads, group, head_dim, dtype, index_dtype, seed=len(CASES)
    )
    expected = reference(q, cache, tables, lens)
    if strided:  # q as a view with a head_dim stride of 2 (a slice of a wider tensor)
        wide = torch.zeros(*q.shape[:2], 2 * head_dim, dtype=dtype)
        wide[..., ::2] = q
        q = wide[..., ::2]
    cache = poison_unread(cache, tables, lens)
    args = [t.to(DEVICE) for t in (q, cache, tables, lens)]
    out = triton_attention.paged_decode_attention(*args)
    assert out.shape == q.shape and out.dtype == dtype and out.is_contiguous()
    torch.testing.assert_close(out.cpu().float(), expected, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


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
        "from minieng.model import triton_attention as t\n"
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
    kernel, prefill chunks through SDPA, and the greedy tokens are the gather path's."""
    from helpers import make_engine, random_prompts

    import minieng.model.triton_attention as ta
    from minieng import SamplingParams

    calls = []
    kernel = ta.paged_decode_attention
    monkeypatch.setattr(ta, "paged_decode_attention", lambda *a: calls.append(a[0].shape[0]) or kernel(*a))

    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    prompts = random_prompts([3, 12, 21, 7], tiny_llama[1].model.config.vocab_size, seed=8)
    reference = make_engine(tiny_llama[1], max_num_seqs=4).generate(prompts, params)
    engine = make_engine(tiny_llama[1], max_num_seqs=4, attention_backend="triton")
    assert [o.token_ids for o in engine.generate(prompts, params)] == [o.token_ids for o in reference]
    layers = tiny_llama[1].model.config.num_hidden_layers
    assert len(calls) >= 9 * layers and max(calls) == 4  # every decode step, the four sequences at once


def test_the_triton_backend_is_refused_where_it_cannot_run(tiny_llama, monkeypatch):
    from helpers import make_engine

    import minieng.model.triton_attention as ta

    monkeypatch.setattr(ta, "INTERPRETED", False)
    with pytest.raises(ValueError, match="attention_backend='triton': a CPU runs Triton kernels only under"):
        make_engine(tiny_llama[1], attention_backend="triton")
    with pytest.raises(ValueError, match="use 'sdpa' or 'triton'"):
        make_engine(tiny_llama[1], attention_backend="flash")


@pytest.mark.parametrize("capability, refused", [((7, 5), True), ((8, 0), False), ((9, 0), False)])
def test_the_triton_backend_is_refused_below_sm_80(monkeypatch, capability, refused):
    """A T4 (sm_75) has no tensor-core mma for the kernel's tl.dot: refused, saying so; sm_80 and
    later pass (the device is only named: nothing runs on it)."""
    from minieng.model.attention import check_attention_backend

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    cuda = torch.device("cuda", 0)
    if refused:
        with pytest.raises(ValueError, match="sm_75: below sm_80 .* use attention_backend='sdpa'"):
            check_attention_backend("triton", 64, cuda)
    else:
        check_attention_backend("triton", 64, cuda)
    check_attention_backend("sdpa", 64, cuda)  # the other backend runs everywhere
