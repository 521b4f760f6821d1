"""The core alone (``minieng.core``): the plain engine runs without a wing, equals the full engine
with every feature off, and its decode step reaches attention in few frames."""

from __future__ import annotations

import json
import subprocess
import sys
import traceback
from pathlib import Path

import pytest
from helpers import random_prompts

from minieng import EngineConfig, LLMEngine, SamplingParams
from minieng.core import attention
from minieng.core.engine_core import EngineCore

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)

# In a fresh interpreter (this process has imported every wing already): build the plain engine on
# the embedded model, generate, list the wing modules loaded, then the full engine's tokens.
PLAIN_THEN_FULL = """
import json, sys
import torch
from minieng.config import EngineConfig, SamplingParams
from minieng.core.engine_core import EngineCore
from minieng.model.loader import load_model

config = EngineConfig(device="cpu", max_model_len=256, num_kv_blocks=64, max_num_seqs=4)
loaded = load_model(config, torch.device("cpu"), torch.float32, 256)
core = EngineCore(config, loaded.model, loaded.tokenizer, loaded.eos_token_ids, 64, 256)
params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
prompts = ["The capital of France is", "Water boils at", "1, 2, 3, 4,"]
ids = [core.add_request(p, params) for p in prompts]
while core.has_unfinished_requests():
    core.step()
plain = [core.output(i).token_ids for i in ids]
wings = sorted(m for m in sys.modules if m.startswith(("minieng.wings", "minieng.engine")))
from minieng import LLMEngine

full = [o.token_ids for o in LLMEngine(config, loaded=loaded).generate(prompts, params)]
print(json.dumps({"plain": plain, "full": full, "wings": wings, "text": core.output(ids[0]).text}))
"""


@pytest.mark.usefixtures("default_model")  # skips where the embedded model is missing
def test_the_plain_engine_needs_no_wing_and_gives_the_full_engine_s_greedy_tokens():
    run = subprocess.run([sys.executable, "-c", PLAIN_THEN_FULL], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["wings"] == [], f"the plain engine imported {result['wings']}"
    assert result["plain"] == result["full"] and all(len(t) == 16 for t in result["plain"])
    assert result["text"].strip(), "the plain engine's output has text"


def test_the_plain_core_refuses_log_probabilities_it_does_not_compute(tiny_llama):
    loaded = tiny_llama[1]
    config = EngineConfig(device="cpu", num_kv_blocks=32, block_size=4, max_model_len=64)
    core = EngineCore(config, loaded.model, None, loaded.eos_token_ids, 32, 64)
    with pytest.raises(ValueError, match="computes no log-probabilities"):
        core.add_request([1, 2, 3], SamplingParams(logprobs=1))
    assert not core.requests, "nothing was queued"
    with pytest.raises(ValueError, match="cannot hold one sequence"):
        EngineCore(config, loaded.model, None, loaded.eos_token_ids, 8, 64)


def test_from_the_step_to_attention_is_four_files_and_seven_frames(tiny_llama, monkeypatch):
    """A plain decode step, read at the attention call: the engine's step, the runner's
    ``execute``, ``run_layout`` and ``decode``, the model's and the layer's forwards, attention."""
    loaded = tiny_llama[1]
    engine = LLMEngine(EngineConfig(device="cpu", num_kv_blocks=32, block_size=4, max_model_len=64), loaded=loaded)
    stacks, attend = [], attention.paged_attention

    def recorded(*args, **kwargs):
        stacks.append(traceback.extract_stack()[:-1])
        return attend(*args, **kwargs)

    monkeypatch.setattr("minieng.core.llama.paged_attention", recorded)
    engine.add_request(random_prompts([5], 100, seed=1)[0], GREEDY)
    engine.step()  # the prefill
    stacks.clear()
    engine.step()  # a decode
    package = Path(attention.__file__).parents[1]
    ours = [f for f in stacks[0] if Path(f.filename).is_relative_to(package)]  # torch's frames left out
    chain = ours[next(i for i, f in enumerate(ours) if f.name == "step") :]
    names = [f.name for f in chain] + ["paged_attention"]
    files = {Path(f.filename).name for f in chain} | {Path(attention.__file__).name}
    assert names == ["step", "execute", "run_layout", "decode", "forward", "forward", "paged_attention"], names
    assert files == {"engine_core.py", "model_runner.py", "llama.py", "attention.py"}
    assert engine.step_records[-1].forward_path == "eager"
