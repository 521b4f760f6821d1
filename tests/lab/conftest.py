"""Fixtures the lab's tests share: the tiny Llama with words to cut prompts from, and a fake clock."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from helpers import bos_tokenizer

from minieng.core import engine_core as engine_module
from minieng.model.loader import LoadedModel


@pytest.fixture(scope="module")
def worded(tiny_llama):
    """The tiny Llama with a word-level tokenizer, so text prompts can be cut for it."""
    loaded = tiny_llama[1]
    return LoadedModel(loaded.model, bos_tokenizer(), loaded.hf_config, set(), None)


@pytest.fixture
def fake_clock(monkeypatch):
    """The engine's clock advances only inside the model runner: 1 ms per step + 1 ms per token."""
    clock = SimpleNamespace(now=100.0)
    monkeypatch.setattr(engine_module, "time", SimpleNamespace(perf_counter=lambda: clock.now))

    def install(engine):
        execute = engine.runner.execute

        def timed(scheduled):
            clock.now += 1e-3 * (1 + sum(n for _, n in scheduled))
            return execute(scheduled)

        engine.runner.execute = timed
        return engine

    return install
