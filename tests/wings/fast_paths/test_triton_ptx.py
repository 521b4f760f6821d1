"""The Triton decode kernels cross-compiled for sm_80 (A100) and sm_90 (H100/H200) on this CPU:
what their PTX says a GPU will run, with no GPU.

``tests/triton_variants.py``'s ``compile_for_gpu`` specializes a launch's arguments as a launch on that GPU
would (Triton's own code: the pool's last stride of 1 and strides divisible by 16 decide whether
loads are vectorized and can go through ``cp.async``) and compiles it with ``triton.compile``;
the PTX is then assembled by the ``ptxas`` in Triton's wheel (``ptxas -v``: registers, spills).
Triton compiles for real only when ``TRITON_INTERPRET`` was unset at its first import, which the
other tests set (``tests/conftest.py``): the compiling runs in a subprocess without it.

Checked, for the split kernel at Llama-3-8B's attention shape (fp16, head_dim 128, 4 query heads
a KV head, blocks of 16) and at an odd one (bf16, head_dim 64, 7 heads a KV head, blocks of 5),
each loading one block id a position, with the installed Triton (Triton 3.6, the GPU image's, gave
the same by hand: 96 registers, ``cp.async`` with ``wait_group 1``):

- tensor cores: ``mma.sync`` (m16n8k16) on both; sm_90's ``wgmma`` needs 64 rows a warp group and
  the kernel's score tile has 16 (a group of query heads, padded), so Triton emits ``mma.sync``;
- prefetching: the K/V tiles (and block ids) travel by ``cp.async``, double-buffered (a
  ``cp.async.wait_group 1`` in the loop: the next tile's copies stay in flight while this one
  computes); the only other global loads are the query tile and the context length;
- ``ptxas -v``: no spills and no stack frame; at most 128 registers a thread (four 128-thread
  programs fit an SM's 64 Ki registers), 64 for the combine kernel; at most 48 KiB of shared
  memory a program (two fit an sm_86/89 SM's ~100 KiB).

Skipped, saying why, where Triton's NVIDIA backend or its ptxas is absent or cannot run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[3]

MAX_REGISTERS = {"_split_kernel": 128, "_combine_kernel": 64}
MAX_SHARED_BYTES = 48 * 1024

# Runs without TRITON_INTERPRET: compiles every (shape, arch, kernel), runs ptxas -v on the PTX, and
# prints one JSON object: {"skip": why} or {"results": [...]}.
SCRIPT = r"""
import json, os, re, subprocess, sys, tempfile

import torch

try:
    from triton.backends.nvidia.compiler import get_ptxas
except ImportError as e:
    print(json.dumps({"skip": f"triton has no NVIDIA backend ({e})"}))
    sys.exit()
from minieng.wings.fast_paths import triton_attention as ta

sys.path.insert(0, "tests")  # the helpers beside conftest.py; cwd is the repository
from triton_variants import compile_for_gpu

assert not ta.INTERPRETED, "TRITON_INTERPRET leaked into the compiling process"
SHAPES = [  # name, dtype, head_dim, query heads a KV head, KV heads, block size
    ("llama3-8b", torch.float16, 128, 4, 8, 16),
    ("odd", torch.bfloat16, 64, 7, 2, 5),
]
results = []
for arch in (80, 90):
    try:
        ptxas = get_ptxas(arch).path
        subprocess.run([ptxas, "--version"], check=True, capture_output=True, timeout=60)
    except Exception as e:  # absent, not executable, or not for this machine
        print(json.dumps({"skip": f"Triton's ptxas for sm_{arch} cannot run here ({type(e).__name__}: {e})"}))
        sys.exit()
    for name, dtype, head_dim, group, kv_heads, block_size in SHAPES:
        # q as the model hands it over: a view of the qkv product, [batch, heads, head_dim]
        qkv = torch.zeros(4, (group + 2) * kv_heads, head_dim, dtype=dtype)
        q = qkv[:, : group * kv_heads]
        cache = torch.zeros(8, block_size, 2 * kv_heads, head_dim, dtype=dtype)
        tables = torch.zeros(4, 16, dtype=torch.long)
        lens = torch.ones(4, dtype=torch.long)
        _, launches = ta.plan_decode(q, cache, tables, lens, num_splits=3)
        for launch in launches:
            kernel = compile_for_gpu(launch, arch)
            ptx = kernel.asm["ptx"]
            target = re.search(r"^\.target\s+(\w+)", ptx, re.M).group(1)
            with tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, "kernel.ptx")
                with open(path, "w") as f:
                    f.write(ptx)
                run = subprocess.run(
                    [ptxas, "-v", f"--gpu-name={target}", path, "-o", os.path.join(tmp, "kernel.cubin")],
                    capture_output=True, text=True, timeout=300,
                )
            info = run.stdout + run.stderr
            regs = re.search(r"Used (\d+) registers", info)
            frame = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", info)
            results.append(dict(
                shape=name, arch=arch, kernel=launch.kernel.fn.__name__, ptxas_rc=run.returncode, ptxas=info[-2000:],
                registers=int(regs.group(1)) if regs else None,
                stack_spill=[int(x) for x in frame.groups()] if frame else None,
                shared=kernel.metadata.shared,
                mma_sync=len(re.findall(r"\bmma\.sync\.aligned\.m16n8k16", ptx)),
                wgmma=len(re.findall(r"\bwgmma\.", ptx)),
                cp_async=len(re.findall(r"\bcp\.async\.c[ag]\.shared\.global", ptx)),
                waits=sorted({int(n) for n in re.findall(r"cp\.async\.wait_group\s+(\d+)", ptx)}),
                global_loads=len(re.findall(r"\bld\.global", ptx)),
            ))
print(json.dumps({"results": results}))
"""


@pytest.fixture(scope="module")
def compiled():
    """What each (shape, arch, kernel) compiled to, or a skip with the reason."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"  # triton 3.9's default, said aloud (it warns otherwise)
    run = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"the compiling subprocess failed:\n{run.stderr[-4000:]}"
    out = json.loads(run.stdout.strip().splitlines()[-1])
    if "skip" in out:
        pytest.skip(out["skip"])
    return out["results"]


def rows(compiled, kernel):
    found = [r for r in compiled if r["kernel"] == kernel]
    assert {(r["shape"], r["arch"]) for r in found} == {(s, a) for s in ("llama3-8b", "odd") for a in (80, 90)}
    return found


def test_the_split_kernel_runs_its_products_on_tensor_cores(compiled):
    for r in rows(compiled, "_split_kernel"):
        where = f"{r['shape']} sm_{r['arch']}"
        assert r["mma_sync"] > 0, f"{where}: no mma.sync, tl.dot fell back to FMA"
        assert r["wgmma"] == 0, f"{where}: wgmma at 16 rows: update the docstring's account"


def test_the_split_kernel_prefetches_its_tiles_with_cp_async(compiled):
    for r in rows(compiled, "_split_kernel"):
        where = f"{r['shape']} sm_{r['arch']}"
        assert r["cp_async"] > 0, f"{where}: the K/V tiles are not loaded with cp.async"
        assert 1 in r["waits"], f"{where}: no cp.async.wait_group 1 (single-buffered): {r['waits']}"
        # the query tile (one or two vector loads) and the context length; K, V and ids go by cp.async
        assert r["global_loads"] <= 3, f"{where}: {r['global_loads']} ld.global: a K/V or id load is synchronous"


@pytest.mark.parametrize("kernel", ["_split_kernel", "_combine_kernel"])
def test_ptxas_registers_spills_and_shared_memory_within_bounds(compiled, kernel):
    for r in rows(compiled, kernel):
        where = f"{kernel} {r['shape']} sm_{r['arch']}"
        assert r["ptxas_rc"] == 0, f"{where}: ptxas failed:\n{r['ptxas']}"
        assert r["registers"] is not None and r["stack_spill"] is not None, f"{where}: no -v report:\n{r['ptxas']}"
        assert r["registers"] <= MAX_REGISTERS[kernel], f"{where}: {r['registers']} registers"
        assert r["stack_spill"] == [0, 0, 0], f"{where}: stack frame, spill stores, spill loads {r['stack_spill']}"
        assert r["shared"] <= MAX_SHARED_BYTES, f"{where}: {r['shared']} bytes of shared memory"
