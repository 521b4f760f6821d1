"""``compiled-regions`` (issue 33): five compiled engines of distinct (model, dtype, scheme) in one
process, each compiling and running its own regions under Dynamo's recompile limit."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

import torch

from minieng.config import SamplingParams
from minieng.wings.fast_paths.forward_paths import COMPILED_REGIONS, COMPILED_STEP
from minieng.engine.llm_engine import LLMEngine
from .checkpoints import GREEDY, TINY, make_checkpoint, release
from .verdicts import decide, untested
from minieng.measure.workloads import text_prompts


def region_engines(device: torch.device) -> list[tuple[str, dict, str, str | None]]:
    """The five engines ``compiled_regions`` builds: (name, shape, dtype, scheme), distinct (model,
    dtype, scheme) each; on a CPU quantized engines run fp32 (fbgemm), on CUDA bf16 and fp16 (one
    scheme there, int8, gpt-fast's compiled form: the question is the regions', not each scheme's)."""
    bias = TINY | dict(attention_bias=True, mlp_bias=True)
    tied = TINY | dict(tie_word_embeddings=True)
    if device.type == "cuda":
        return [
            ("tiny", TINY, "bfloat16", None),
            ("tiny", TINY, "bfloat16", "int8"),
            ("tiny", TINY, "float16", None),
            ("tiny-bias", bias, "bfloat16", None),
            ("tiny-tied", tied, "bfloat16", None),
        ]
    return [
        ("tiny", TINY, "float32", None),
        ("tiny", TINY, "float32", "int8"),
        ("tiny", TINY, "float32", "w8a8"),
        ("tiny-bias", bias, "float32", None),
        ("tiny-tied", tied, "float32", None),
    ]


def compiled_regions(work: Path, device: torch.device) -> list[dict]:
    """Five compiled engines (``region_engines``, strict, eager decoding on CUDA so every decode
    step calls the regions) built one after another in this process, then each decoding, all with
    Dynamo's ``fail_on_recompile_limit_hit`` (a region that would run eagerly raises). An engine
    fails when it raised, compiled fewer than 4 graphs of its own (2 regions x 2 shapes), or a step
    ran off its compiled path (prefills: the regions; decodes: the regions on CUDA, the compiled
    step on a CPU)."""
    from minieng.wings.fast_paths.compilation import compiler_missing  # lazy: torch._dynamo is slow to import

    if (why := compiler_missing(device)) is not None:
        return [untested("compiled-regions", why)]
    from torch._dynamo import config as dynamo_config
    from torch._dynamo.utils import counters

    strict = (
        dynamo_config.patch(fail_on_recompile_limit_hit=True)
        if hasattr(dynamo_config, "fail_on_recompile_limit_hit")
        else nullcontext()
    )
    expected = COMPILED_REGIONS if device.type == "cuda" else COMPILED_STEP
    rows, engines = [], []
    with strict:
        for name, shape, dtype, scheme in region_engines(device):
            row = {"model": name, "dtype": dtype, "scheme": scheme}
            rows.append(row)
            before = counters["stats"]["unique_graphs"]
            try:
                path = work / name
                if not (path / "config.json").is_file():
                    make_checkpoint(path, shape, 512, device, weights=False)
                engine = LLMEngine(
                    model=str(path), load_format="dummy", device=str(device), dtype=dtype, quantization=scheme,
                    compile=True, enforce_eager=device.type == "cuda", strict_forward_paths=True, max_num_seqs=4,
                    max_model_len=256, kv_cache_memory_gib=0.0625, enable_prefix_caching=False,
                )  # fmt: skip
                engines.append((row, engine))
            except Exception as e:  # noqa: BLE001 (the failure is the finding)
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            row["graphs"] = counters["stats"]["unique_graphs"] - before
        for row, engine in engines:
            try:
                first = len(engine.step_records)
                prompts = text_prompts(engine.tokenizer, 9, 2)
                engine.generate(prompts, SamplingParams(max_tokens=4, **GREEDY))
                steps = engine.step_records[first:]
                paths = [s.forward_path for s in steps if s.num_prefill_tokens == 0]
                prefills = [s.forward_path for s in steps if s.num_prefill_tokens > 0]  # the regions, every device
                row["off_path"] = sum(p != expected for p in paths) + sum(p != COMPILED_REGIONS for p in prefills)
                row["decode_steps"] = len(paths)
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    del engines
    release()
    failing = [r for r in rows if "error" in r or r["graphs"] < 4 or r.get("off_path", 1) or not r.get("decode_steps")]
    reason = f"{len(rows) - len(failing)} of {len(rows)} ran their own compiled regions ({expected})"
    if failing:
        reason += "; failing: " + ", ".join(f"{r['model']} {r['dtype']} {r['scheme']}" for r in failing)
    return [decide("compiled-regions", len(failing), reason, {"engines": rows})]
