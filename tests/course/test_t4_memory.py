"""Issue 19, item 2: the notebooks on Colab's T4 (15 GiB, fp16), simulated on the CPU.

With no KV budget an engine on CUDA sized its pool from 90% of the GPU (~12 GB of a T4 for the
135M model), and ``measure_ceilings`` then asked for 2 x 2 GiB for its copy: out of memory in
notebooks 01, 03 and 09. Now every notebook reads its ceilings before it builds an engine (their
buffers sized from the free memory), and gives every engine a KV budget. This test reads each
notebook's source and parameters, and checks on the T4's memory figures (monkeypatched where the
code reads them) that its engines' weights and pools, plus the ceilings' buffers, fit.

Issue 33: notebook 10's lab calls build engines of their own beside the served one (the batch-cap
sweep's, one at a time; the disaggregation comparison's, five at once). A dry run of those calls on
a tiny model counts the engines each holds at once, from the code; the T4's memory is then summed
phase by phase (the ceilings, the load, the sweep, the comparison), and the peak must leave
``MARGIN`` of the 15 GiB.
"""

from __future__ import annotations

import gc
import inspect
import json
import re
import sys
import weakref
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import make_engine, random_prompts

import minieng.lab
from minieng import LLMEngine
from minieng.config import EngineConfig, published_config
from minieng.lab import batch_cap_sweep, compare_disaggregation, draft_alone_engine
from minieng.lab.backend import EngineBackend
from minieng.lab.disaggregation import simulated_runs
from minieng.lab.model_for_device import PROBE_KV_GIB
from minieng.measure.model_choice import choose_model
from minieng.wings.gpu_memory.memory_plan import HEADROOM, plan_memory
from minieng.wings.gpu_memory.kv_sizing import GATHER_SCRATCH_FRACTION  # each engine's gather scratch
from minieng.measure import peaks
from minieng.measure.harness import SMOKE_ENV
from minieng.measure.metrics import SLO
from minieng.measure.workloads import RequestSpec
from minieng.core.kv_cache import num_blocks_for_budget

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))
GIB = 1024**3
T4_TOTAL = peaks.DEVICE_MEMORY_MIB["T4"][0] * 1024**2  # 15,360 MiB: what nvidia-smi shows, not the 16 GB sold
CUDA_CONTEXT = peaks.CUDA_CONTEXT_BYTES  # what a program's tensors never get of it (the context, the driver's share)
FP16 = torch.float16
BLOCK = 16
# Engines a notebook's package calls build beside its own: 08's run_quantization, one per scheme a T4
# runs (int8, int4, w8a8 at most), from its engine's config (so with its budget); 09's
# draft_alone_engine, the draft's weights (shared) with a pool of its own (``hidden_kv_gib``).
# Notebook 10's (its sweep's and its disaggregation comparison's) are counted from the code, phase by
# phase, by test_notebook_10_fits_a_t4_phase_by_phase.
HIDDEN_ENGINES = {"08": 3, "09": 1}
# The model course_model picks for a T4 (datasheet 320 GB/s, a graph replay's ~20 us per layer):
# the engines built from ``**lesson_model.engine_args`` load it; beside them, the embedded model's
# probe engine (``PROBE_KV_GIB``) serves real text (``talker``).
T4_CHOICE = choose_model(320e9, T4_TOTAL - CUDA_CONTEXT, 2, 20e-6).name


def code_of(path: Path) -> tuple[dict, str]:
    """(the parameters cell's values in full mode, the code after the Colab install cell)."""
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    params_cell = next(c for c in cells if "parameters" in c.get("metadata", {}).get("tags", []))
    namespace: dict = {}
    with pytest.MonkeyPatch.context() as mp:  # the suite runs with MINIENG_SMOKE=1: read full mode
        mp.delenv(SMOKE_ENV, raising=False)
        exec("".join(params_cell["source"]), namespace)
    return namespace, "\n".join("".join(c["source"]) for c in cells[1:])


def engine_calls(source: str, name: str = "LLMEngine") -> list[tuple[int, str]]:
    """(position, argument text) of every ``name(...)`` call in ``source`` (default ``LLMEngine``)."""
    calls = []
    for m in re.finditer(rf"\b{name}\(", source):
        depth, i = 1, m.end()
        while depth:
            depth += {"(": 1, ")": -1}.get(source[i], 0)
            i += 1
        calls.append((m.start(), source[m.end() : i - 1]))
    return calls


def argument(args: str, name: str, namespace: dict):
    m = re.search(rf"\b{name}=([^,)\n]+)", args)
    return eval(m.group(1), dict(namespace)) if m else None  # noqa: S307 (the notebook's own expression)


def built_engines(source: str) -> list[tuple[int, str, bool]]:
    """(position, argument text, whether it loads the lesson's model) of every engine the notebook's own
    code builds, in order: its ``LLMEngine(...)`` calls, and its ``lesson_backend(...)`` calls, whose
    ``EngineBackend`` builds ``LLMEngine(**lesson_model.engine_args, **engine_args)`` with the call's
    keywords (checked below)."""
    own = [(at, args, "lesson_model.engine_args" in args) for at, args in engine_calls(source)]
    return sorted(own + [(at, args, True) for at, args in engine_calls(source, "lesson_backend")])


def longest_prompt(source: str, params: dict) -> int | None:
    """The longest prompt the notebook asks of its engines in full mode: the largest of its
    ``max_prompt_tokens=`` arguments (its probe's, its workloads') and of ``backend.probe``'s first
    when positional; None where it names none."""
    asked = [eval(m.group(1), dict(params)) for m in re.finditer(r"\bmax_prompt_tokens=([^,)\n]+)", source)]  # noqa: S307
    for _, args in engine_calls(source, r"backend\.probe"):
        first = args.split(",")[0]
        if "=" not in first:
            asked.append(eval(first, dict(params)))  # noqa: S307 (the notebook's own expression)
    return max(asked, default=None)


def hidden_kv_gib(name: str, source: str, params: dict, main_gib: float) -> float:
    """The KV budget of each of a notebook's hidden engines: 08's inherit its engine's (``main_gib``);
    09's ``draft_alone_engine`` takes its own ``kv_cache_memory_gib``, as the notebook passes it or
    by default."""
    if name != "09":
        return main_gib
    ((_, args),) = engine_calls(source, "draft_alone_engine")
    given = argument(args, "kv_cache_memory_gib", params)
    return (
        given if given is not None else inspect.signature(draft_alone_engine).parameters["kv_cache_memory_gib"].default
    )


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


# Calls that read the ceilings: ``lab.lesson_backend`` reads them before it builds its engine (checked below).
READS_CEILINGS = ("machine_ceilings(", "lesson_backend(")


def test_the_lesson_backend_reads_the_ceilings_before_it_builds_its_engine():
    from minieng.lab.backend import EngineBackend

    init = inspect.getsource(EngineBackend.__init__)
    assert -1 < init.find("machine_ceilings(") < init.find("LLMEngine(")


def test_the_lesson_backend_builds_the_lesson_model_with_the_notebooks_arguments():
    """What ``built_engines`` counts a ``lesson_backend(...)`` call as: one engine of ``course_model``'s
    choice (whose probe engine it keeps), built with the call's keywords."""
    init = inspect.getsource(EngineBackend.__init__)
    assert "course_model(" in init and init.count("LLMEngine(") == 1
    assert "LLMEngine(**self.model.engine_args, **engine_args)" in init
    assert "EngineBackend(model, cache, **engine_args)" in inspect.getsource(minieng.lab.lesson_backend)


def test_draft_alone_engine_builds_one_engine_of_the_drafts_shared_weights_with_its_own_pool():
    """What ``HIDDEN_ENGINES["09"]`` and ``hidden_kv_gib`` count: one engine, no weights of its own."""
    code = inspect.getsource(draft_alone_engine)
    assert code.count("LLMEngine(") == 1 and "engine.drafter.model" in code
    assert "LLMEngine(loaded=draft, enable_prefix_caching=False, kv_cache_memory_gib=kv_cache_memory_gib)" in code


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_notebook_reads_its_ceilings_before_any_engine_takes_the_gpu(path):
    _, source = code_of(path)
    calls = engine_calls(source)
    reads = [source.index(call) for call in READS_CEILINGS if call in source]
    assert reads, f"{path.name}: reads no ceilings, so it reads no noise either"
    assert "measure_ceilings(" not in source, f"{path.name}: measures its ceilings anew instead of reading them once"
    if calls:
        assert min(reads) < calls[0][0], (
            f"{path.name}: builds an engine before reading the ceilings, whose copy then meets a GPU the pool filled"
        )


@pytest.mark.parametrize(
    "path",
    [p for p in NOTEBOOKS if "LLMEngine(" in (t := p.read_text()) or "lesson_backend(" in t],
    ids=lambda p: p.name,
)
def test_every_engine_of_a_notebook_has_a_kv_budget_and_all_fit_a_t4(path, t4, shapes):
    params, source = code_of(path)
    calls = built_engines(source)
    main_gib, total_kv, weights, longest = None, 0, 0, []
    # course_model (lesson_backend's too) on a GPU times the embedded model first, and keeps that engine
    if "course_model(" in source or "lesson_backend(" in source:
        small = shapes["SmolLM2-135M"]
        weights += small.num_params * FP16.itemsize
        total_kv += num_blocks_for_budget(small, FP16, BLOCK, PROBE_KV_GIB) * BLOCK * small.kv_bytes_per_token(2)
    for _, args, of_lesson in calls:
        inherits = args.startswith(("replace(engine.config", "replace(talker.config"))
        gib = argument(args, "kv_cache_memory_gib", params)
        blocks = argument(args, "num_kv_blocks", params)
        assert inherits or gib is not None or blocks is not None, (
            f"{path.name}: an engine of ({args[:60]}...) has no KV budget: on a GPU it takes 90% of the device"
        )
        gpu_pair = "GPU_TARGET" in args
        lesson = of_lesson or ("loaded=engine.loaded" in args and "lesson_model" in source)
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
    hidden = shapes[T4_CHOICE] if "lesson_model" in source or "lesson_backend(" in source else shapes["SmolLM2-135M"]
    num_hidden = HIDDEN_ENGINES.get(path.name[:2], 0)
    hidden_gib = hidden_kv_gib(path.name[:2], source, params, main_gib) if num_hidden else main_gib
    total_kv += (
        num_hidden * num_blocks_for_budget(hidden, FP16, BLOCK, hidden_gib) * BLOCK * hidden.kv_bytes_per_token(2)
    )

    # Each pool holds a whole sequence of its engine's max_model_len: no capping, no refusal. The
    # T4's chosen model (the 1.7B, full multi-head KV: 192 KiB a token) holds fewer in the same
    # budget: its engine caps max_model_len to the pool, with a warning, and the probes and sweeps
    # stop there; the pool must still hold the longest prompt the lesson asks of it (its probe's
    # and workloads' ``max_prompt_tokens``, and its answer's token), and 4,096 tokens where it asks more.
    asked = longest_prompt(source, params)
    for tokens, max_model_len, capped in longest:
        need = min(max_model_len, 4096, asked + 1 if asked else 4096) if capped else max_model_len
        assert tokens >= need, f"{path.name}: a pool of {tokens} tokens for max_model_len={max_model_len}"
    # The ceilings' buffers, sized on the empty T4 (the notebook reads them before any engine).
    n, copy_bytes = peaks.ceiling_sizes(t4, FP16)
    ceilings = 3 * n * n * FP16.itemsize + 2 * copy_bytes
    # What the notebook's engines hold at once, with their graphs' scratch, plus the ceilings'
    # buffers as if they were still there: within the 90% an engine leaves for the rest.
    scratch = GATHER_SCRATCH_FRACTION * T4_TOTAL * (len(calls) + num_hidden)  # the hidden engines' graphs too
    need = weights + total_kv + scratch + ceilings
    assert need <= HEADROOM * T4_TOTAL, (
        f"{path.name}: weights {weights / GIB:.2f} + KV {total_kv / GIB:.2f} + graph "
        f"scratch {scratch / GIB:.2f} + ceilings {ceilings / GIB:.2f} GiB exceed a T4"
    )
    # The engine's own check agrees for the first engine (plan_memory reads get_device_properties).
    _, first, first_of_lesson = calls[0]
    model = (
        shapes["SmolLM2-1.7B"]
        if "GPU_TARGET" in first
        else shapes[T4_CHOICE]
        if first_of_lesson or "lesson_model" in first
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


# -- notebook 10, phase by phase (issue 33) ----------------------------------------------------------

NOTEBOOK_10 = next(p for p in NOTEBOOKS if p.name.startswith("10_"))
# Kept free of the 15 GiB at the peak: what the figures below leave out (the caching allocator's
# fragmentation, as a freed engine's blocks are reused by the next; cuBLAS's workspaces; the
# kernels the CUDA context loads as the notebook runs), and so that the peak also fits the 14.5 GiB
# cap under which the GPU check runs notebook 10's engines (issue 33, section 5).
MARGIN = GIB // 2
# A 2-byte model's load holds at most this many bytes a parameter at its peak: built on the meta
# device in its dtype, no float32 copy first (issue 33, section 1, whose test bounds it so).
LOAD_BYTES_PER_PARAM = 2.05
# The lab functions of notebook 10 that build engines, by how they are counted here: the served
# engine that lesson_backend builds (``EngineBackend``, beside the probe engine its course_model keeps:
# ``backend.model.probe_engine``), and the calls the dry run counts.
SERVED_BUILDER = "lesson_backend"
DRY_RUN_BUILDERS = ("batch_cap_sweep", "compare_disaggregation")


def builds_engines(obj, seen: set | None = None) -> bool:
    """Whether ``obj`` (a function, or a class by its ``__init__``) builds an ``LLMEngine``: in its own
    code, or in that of a minieng function or class it calls by name (``lesson_backend`` builds its
    engine in ``EngineBackend``)."""
    seen = set() if seen is None else seen
    if obj in seen:
        return False
    seen.add(obj)
    code_obj = vars(obj).get("__init__") if inspect.isclass(obj) else obj
    try:
        code = inspect.getsource(code_obj)
    except (OSError, TypeError):  # no source: a generated or inherited __init__
        return False
    if "LLMEngine(" in code:
        return True
    names = vars(sys.modules[obj.__module__])
    return any(
        (inspect.isfunction(callee) or inspect.isclass(callee))
        and callee.__module__.startswith("minieng.")
        and builds_engines(callee, seen)
        for name in set(re.findall(r"\b([A-Za-z_]\w*)\(", code))
        if (callee := names.get(name)) is not None
    )


def engine_holds(m, num_blocks: int, max_num_seqs: int) -> int:
    """What an engine of ``m`` in fp16 holds on the T4 beside the weights: its pool (``num_blocks``,
    plus the null and scratch blocks: ``KVCache``), and for its CUDA graphs the share of the device
    ``kv_sizing`` keeps out of a pool for them (the graphs' gathers take half of it at most, the
    capture's eager warm-up the other half) with their static logits, [max_num_seqs, vocab] float32."""
    pool = (num_blocks + 2) * BLOCK * m.kv_bytes_per_token(FP16.itemsize)
    return pool + int(GATHER_SCRATCH_FRACTION * T4_TOTAL) + max_num_seqs * m.vocab_size * 4


def step_holds(m, tokens: int, rows: int, max_model_len: int) -> int:
    """A bound of what one eager step of ``tokens`` tokens allocates for a moment in fp16: a layer's
    activations (the residual, the normed input, q, k, v, the attention's output and the MLP's gate,
    up and product, all at once: more than any point of the layer holds), one prefill chunk's K and V
    gathered and repeated to every query head (``attention.paged_attention``) at ``max_model_len``,
    and the sampled ``rows``' logits in fp16 then float32."""
    kv_dim = m.num_key_value_heads * m.head_dim
    layer = tokens * (4 * m.hidden_size + 2 * kv_dim + 3 * m.intermediate_size) * FP16.itemsize
    chunk = 2 * 2 * max_model_len * m.num_attention_heads * m.head_dim * FP16.itemsize
    return layer + chunk + rows * m.vocab_size * (FP16.itemsize + 4)


@pytest.fixture(scope="module")
def notebook_10_dry_run(tiny_llama):
    """Notebook 10's engine-building lab calls with its full-mode arguments, run on a tiny model on the
    CPU: per call, the most engines alive at once beside the served one. Every engine built is
    counted while it lives, the cycle collector off: one kept only by a reference cycle counts as
    held, as its pool would be on a GPU until a collection. Returns ``({call: engines}, the
    comparison's keyword arguments, the sweep's caps)``."""
    params, source = code_of(NOTEBOOK_10)
    assert params["SMOKE"] is False, "the parameters cell read in smoke mode: unset MINIENG_SMOKE"
    ((_, sweep_args),) = engine_calls(source, "batch_cap_sweep")
    caps = eval(sweep_args.split(",")[2], dict(params))  # noqa: S307 (the notebook's own CAPS)
    ((_, compare_args),) = engine_calls(source, "compare_disaggregation")
    names = ("num_prefill", "num_decode", "real_time_baseline")
    kwargs = {k: v for k in names if (v := argument(compare_args, k, params)) is not None}
    _, loaded = tiny_llama
    served = make_engine(loaded)
    specs = [RequestSpec(0.05 * i, 5 + 3 * (i % 3), 2 + i % 3) for i in range(4)]
    prompts = random_prompts([s.prompt_tokens for s in specs], served.model_config.vocab_size, seed=0)
    slo = SLO(ttft_ms=1e6, tpot_ms=1e6)
    alive, counts = weakref.WeakSet(), []
    build = LLMEngine.__init__

    def counted(self, *args, **fields):
        build(self, *args, **fields)
        alive.add(self)
        assert self.loaded is served.loaded, "an engine with weights of its own: count its model"
        assert self.block_manager.num_blocks <= served.block_manager.num_blocks, "a pool above the served one's"
        counts.append(len(alive))

    held = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(LLMEngine, "__init__", counted)
        gc.disable()
        try:
            batch_cap_sweep(served, specs, caps, slo, prompts=prompts)
            held["batch_cap_sweep"], counts[:] = max(counts), []
            compare_disaggregation(served, specs, slo, prompts, **kwargs)
            held["compare_disaggregation"] = max(counts)
        finally:
            gc.enable()
    return held, kwargs, caps


def test_notebook_10_builds_engines_only_where_counted():
    """Every function notebook 10 imports from minieng.lab that builds an engine is counted below: a
    new one (or a lab call that starts building one) fails here until the phases count it."""
    _, source = code_of(NOTEBOOK_10)
    imported = {
        name.strip()
        for m in re.finditer(r"from minieng\.lab import ([^\n#]+)", source)
        for name in m.group(1).split(",")
    }
    builders = {name for name in imported if builds_engines(getattr(minieng.lab, name))}
    assert builders == {SERVED_BUILDER, *DRY_RUN_BUILDERS}
    assert not engine_calls(source), "notebook 10 builds engines of its own beside the served one: count them"
    assert len(engine_calls(source, SERVED_BUILDER)) == 1, "notebook 10 builds more than one served engine: count them"


def test_notebook_10_fits_a_t4_phase_by_phase(t4, shapes, notebook_10_dry_run, capsys):
    """The T4's memory at each phase of notebook 10 in full mode, with the engines the dry run counts:
    the peak, plus ``MARGIN``, within the 15 GiB. The served engine keeps serving (and the probe engine
    stays in ``lesson_model``) through both experiments; their engines share its weights."""
    held, kwargs, caps = notebook_10_dry_run
    # The comparison holds every engine of its simulated runs at once (its own test checks the code).
    runs = simulated_runs(kwargs.get("num_prefill", 1), kwargs.get("num_decode", 1))
    assert held["compare_disaggregation"] == sum(len(roles) for roles in runs.values())
    params, source = code_of(NOTEBOOK_10)
    # The served engine: lesson_backend's, of the lesson's model with the call's keywords (checked above).
    ((_, served_args),) = engine_calls(source, SERVED_BUILDER)
    model, small, defaults = shapes[T4_CHOICE], shapes["SmolLM2-135M"], EngineConfig()
    served_gib = argument(served_args, "kv_cache_memory_gib", params)
    assert served_gib is not None, "notebook 10's served engine has no KV budget: on a GPU it takes 90% of the device"
    assert argument(served_args, "max_num_seqs", params) is None, "the served engine's max_num_seqs: count it below"
    blocks = num_blocks_for_budget(model, FP16, BLOCK, served_gib)
    max_model_len = min(model.max_position_embeddings, blocks * BLOCK)  # the served engine's, capped to its pool
    probe = small.num_params * FP16.itemsize + engine_holds(
        small, num_blocks_for_budget(small, FP16, BLOCK, PROBE_KV_GIB), defaults.max_num_seqs
    )
    weights = model.num_params * FP16.itemsize
    served = weights + engine_holds(model, blocks, defaults.max_num_seqs)
    # Each engine of the two calls: a pool of at most the served one's blocks (comparison_pool; the
    # sweep's inherit its budget), its own graphs; the sweep's caps set its batches and steps.
    sweep_seqs, sweep_tokens = max(s for s, _ in caps), max(t for _, t in caps)
    n, copy_bytes = peaks.ceiling_sizes(t4, FP16)
    k_sweep, k_compare = held["batch_cap_sweep"], held["compare_disaggregation"]
    phases = {
        "machine_ceilings' buffers, before any engine": CUDA_CONTEXT + 3 * n * n * FP16.itemsize + 2 * copy_bytes,
        f"the {T4_CHOICE}'s load beside the probe engine": CUDA_CONTEXT
        + probe
        + LOAD_BYTES_PER_PARAM * model.num_params,
        f"batch_cap_sweep: {k_sweep} engine(s) beside the served one": CUDA_CONTEXT
        + probe
        + served
        + k_sweep * engine_holds(model, blocks, sweep_seqs)
        + step_holds(model, sweep_tokens, sweep_seqs, max_model_len),
        f"compare_disaggregation: {k_compare} engines beside the served one": CUDA_CONTEXT
        + probe
        + served
        + k_compare * engine_holds(model, blocks, defaults.max_num_seqs)
        + step_holds(model, defaults.max_num_batched_tokens, defaults.max_num_seqs, max_model_len),
    }
    peak_phase = max(phases, key=phases.get)
    peak = phases[peak_phase]
    each = engine_holds(model, blocks, defaults.max_num_seqs)
    report = [f"notebook 10 on a T4 ({T4_TOTAL / GIB:.0f} GiB, fp16, {T4_CHOICE}; the comparison's {kwargs}):"]
    report += [f"  {bytes_ / GIB:6.2f} GiB  {phase}" for phase, bytes_ in phases.items()]
    report.append(
        f"  peak {peak / GIB:.2f} GiB at {peak_phase.split(':')[0]}: margin {(T4_TOTAL - peak) / GIB:.2f} GiB "
        f"({MARGIN / GIB:.2f} required); each engine of the comparison {each / GIB:.2f} GiB"
    )
    with capsys.disabled():
        print("\n" + "\n".join(report))
    assert peak + MARGIN <= T4_TOTAL, "\n".join(report)
