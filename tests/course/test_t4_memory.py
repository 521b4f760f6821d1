"""Issue 19, item 2: the notebooks on Colab's T4 (15 GiB, fp16), simulated on the CPU.

With no KV budget an engine on CUDA sized its pool from 90% of the GPU (~12 GB of a T4 for the
135M model), and ``measure_ceilings`` then asked for 2 x 2 GiB for its copy: out of memory in
notebooks 01, 03 and 09. Now every notebook reads its ceilings before it builds an engine (their
buffers sized from the free memory), and gives every engine a KV budget. This test reads each
notebook's source and parameters, and checks on the T4's memory figures (monkeypatched where the
code reads them) that its engines' weights and pools, plus the ceilings' buffers, fit.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from minieng.config import published_config
from minieng.lab.model_for_device import PROBE_KV_GIB
from minieng.measure.model_choice import choose_model
from minieng.engine.memory_plan import HEADROOM, plan_memory
from minieng.engine.kv_sizing import GATHER_SCRATCH_FRACTION  # each engine's gather scratch
from minieng.measure import peaks
from minieng.model.kv_cache import num_blocks_for_budget

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))
GIB = 1024**3
T4_TOTAL = 15 * GIB
CUDA_CONTEXT = 300 * 1024**2  # what the CUDA context holds before anything is allocated
FP16 = torch.float16
BLOCK = 16
# Engines a notebook's package calls build beside its own, from its engine's config (so with its
# budget): 08's run_quantization, one per scheme a T4 runs (int8, int4, w8a8 at most).
HIDDEN_ENGINES = {"08": 3}
# The model course_model picks for a T4 (datasheet 320 GB/s, a graph replay's ~20 us per layer):
# the engines built from ``**lesson_model.engine_args`` load it; beside them, the embedded model's
# probe engine (``PROBE_KV_GIB``) serves real text (``talker``).
T4_CHOICE = choose_model(320e9, T4_TOTAL - CUDA_CONTEXT, 2, 20e-6).name


def code_of(path: Path) -> tuple[dict, str]:
    """(the parameters cell's values in full mode, the code after the Colab install cell)."""
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    params_cell = next(c for c in cells if "parameters" in c.get("metadata", {}).get("tags", []))
    namespace: dict = {}
    exec("".join(params_cell["source"]), namespace)  # MINIENG_SMOKE is unset here: full mode
    return namespace, "\n".join("".join(c["source"]) for c in cells[1:])


def engine_calls(source: str) -> list[tuple[int, str]]:
    """(position, argument text) of every ``LLMEngine(...)`` call in ``source``."""
    calls = []
    for m in re.finditer(r"\bLLMEngine\(", source):
        depth, i = 1, m.end()
        while depth:
            depth += {"(": 1, ")": -1}.get(source[i], 0)
            i += 1
        calls.append((m.start(), source[m.end() : i - 1]))
    return calls


def argument(args: str, name: str, namespace: dict):
    m = re.search(rf"\b{name}=([^,)\n]+)", args)
    return eval(m.group(1), dict(namespace)) if m else None  # noqa: S307 (the notebook's own expression)


@pytest.fixture
def t4(monkeypatch):
    """torch.cuda as a T4 with nothing allocated reports it."""
    props = SimpleNamespace(name="Tesla T4", total_memory=T4_TOTAL, major=7, minor=5)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (T4_TOTAL - CUDA_CONTEXT, T4_TOTAL))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    return torch.device("cuda")


@pytest.fixture(scope="module")
def shapes():
    names = {"SmolLM2-135M", "SmolLM2-1.7B", T4_CHOICE}
    return {name: published_config(name) for name in names}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_notebook_reads_its_ceilings_before_any_engine_takes_the_gpu(path):
    _, source = code_of(path)
    calls = engine_calls(source)
    assert "machine_ceilings(" in source, f"{path.name}: reads no ceilings, so it reads no noise either"
    assert "measure_ceilings(" not in source, f"{path.name}: measures its ceilings anew instead of reading them once"
    if calls:
        assert source.index("machine_ceilings(") < calls[0][0], (
            f"{path.name}: builds an engine before reading the ceilings, whose copy then meets a GPU the pool filled"
        )


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if "LLMEngine(" in p.read_text()], ids=lambda p: p.name)
def test_every_engine_of_a_notebook_has_a_kv_budget_and_all_fit_a_t4(path, t4, shapes):
    params, source = code_of(path)
    calls = engine_calls(source)
    main_gib, total_kv, weights, longest = None, 0, 0, []
    if "course_model(" in source:  # on a GPU it times the embedded model first, and keeps that engine
        small = shapes["SmolLM2-135M"]
        weights += small.num_params * FP16.itemsize
        total_kv += num_blocks_for_budget(small, FP16, BLOCK, PROBE_KV_GIB) * BLOCK * small.kv_bytes_per_token(2)
    for _, args in calls:
        inherits = args.startswith(("replace(engine.config", "replace(talker.config"))
        gib = argument(args, "kv_cache_memory_gib", params)
        blocks = argument(args, "num_kv_blocks", params)
        assert inherits or gib is not None or blocks is not None, (
            f"{path.name}: LLMEngine({args[:60]}...) has no KV budget: on a GPU it takes 90% of the device"
        )
        gpu_pair = "GPU_TARGET" in args
        lesson = "lesson_model.engine_args" in args or ("loaded=engine.loaded" in args and "lesson_model" in source)
        models = (
            [shapes["SmolLM2-1.7B"], shapes["SmolLM2-135M"]]
            if gpu_pair
            else [shapes[T4_CHOICE]]
            if lesson or args.startswith("replace(engine.config")
            else [shapes["SmolLM2-135M"]]
        )
        if "loaded=" not in args:  # an engine of its own weights, not another's
            weights += sum(m.num_params * FP16.itemsize for m in models)
        if gib is None and blocks is None:
            gib = main_gib
        if blocks is None:
            blocks = num_blocks_for_budget(models[0], FP16, BLOCK, gib)
            main_gib = main_gib if main_gib is not None else gib
            max_model_len = argument(args, "max_model_len", params) or models[0].max_position_embeddings
            longest.append((blocks * BLOCK, max_model_len, models[0] is shapes[T4_CHOICE] and not gpu_pair))
        total_kv += blocks * BLOCK * sum(m.kv_bytes_per_token(FP16.itemsize) for m in models)
    hidden = shapes[T4_CHOICE] if "lesson_model" in source else shapes["SmolLM2-135M"]
    total_kv += (
        HIDDEN_ENGINES.get(path.name[:2], 0)
        * num_blocks_for_budget(hidden, FP16, BLOCK, main_gib)
        * BLOCK
        * hidden.kv_bytes_per_token(2)
    )

    # Each pool holds a whole sequence of its engine's max_model_len: no capping, no refusal. The
    # T4's chosen model (the 1.7B, full multi-head KV: 192 KiB a token) holds fewer in the same
    # budget: its engine caps max_model_len to the pool, with a warning, and the probes and sweeps
    # stop there; the pool must still hold the longest prompt a lesson asks of it (4,096 tokens).
    for tokens, max_model_len, capped in longest:
        need = min(max_model_len, 4096) if capped else max_model_len
        assert tokens >= need, f"{path.name}: a pool of {tokens} tokens for max_model_len={max_model_len}"
    # The ceilings' buffers, sized on the empty T4 (the notebook reads them before any engine).
    n, copy_bytes = peaks.ceiling_sizes(t4, FP16)
    ceilings = 3 * n * n * FP16.itemsize + 2 * copy_bytes
    # What the notebook's engines hold at once, with their graphs' scratch, plus the ceilings'
    # buffers as if they were still there: within the 90% an engine leaves for the rest.
    scratch = GATHER_SCRATCH_FRACTION * T4_TOTAL * len(calls)
    need = weights + total_kv + scratch + ceilings
    assert need <= HEADROOM * T4_TOTAL, (
        f"{path.name}: weights {weights / GIB:.2f} + KV {total_kv / GIB:.2f} + graph "
        f"scratch {scratch / GIB:.2f} + ceilings {ceilings / GIB:.2f} GiB exceed a T4"
    )
    # The engine's own check agrees for the first engine (plan_memory reads get_device_properties).
    first = calls[0][1]
    model = (
        shapes["SmolLM2-1.7B"]
        if "GPU_TARGET" in first
        else shapes[T4_CHOICE]
        if "lesson_model" in first
        else shapes["SmolLM2-135M"]
    )
    plan = plan_memory(model, FP16, num_blocks_for_budget(model, FP16, BLOCK, main_gib), BLOCK, t4)
    assert plan.gpu_memory_bytes == T4_TOTAL and not [p for p in plan.problems() if "GPU" in p]


def test_the_old_setup_of_notebook_01_would_not_fit(t4, shapes):
    """The figures the test above uses, on notebook 01 as it was: a device-sized pool (90% of the T4,
    capped at max_num_seqs=64 sequences of 8,192 tokens) and then a 2 x 2 GiB copy."""
    model = shapes["SmolLM2-135M"]
    per_token = model.kv_bytes_per_token(FP16.itemsize)
    device_sized = min(64 * 8192 * per_token, int(0.9 * T4_TOTAL) - model.num_params * 2 - CUDA_CONTEXT)
    free_after = T4_TOTAL - CUDA_CONTEXT - model.num_params * 2 - device_sized
    assert device_sized > 10 * GIB and free_after < 2 * 2 * GIB  # the old copy's buffers could not fit
    n, copy_bytes = peaks.ceiling_sizes(t4, FP16, free_bytes=free_after)  # now they are sized to fit
    assert 3 * n * n * 2 + 2 * copy_bytes <= free_after
