"""The model each notebook measures: the embedded default on a CPU, a published shape chosen for a GPU,
a shape's random weights when downloads are not allowed, and real weights wherever text matters."""

from __future__ import annotations

import pytest

import minieng.lab.model_for_device as cm
from minieng import LLMEngine, SamplingParams
from minieng.config import DEFAULT_MODEL_NAME

pytestmark = pytest.mark.real_model


@pytest.fixture(autouse=True)
def no_env_model(monkeypatch):
    monkeypatch.delenv(cm.MODEL_ENV, raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_on_a_cpu_the_lesson_measures_the_embedded_model_with_real_weights():
    chosen = cm.course_model(device="cpu")
    assert chosen.name == DEFAULT_MODEL_NAME and chosen.engine_args == {} and chosen.real_weights
    assert chosen.choice is None and chosen.bytes_dominate is None
    assert "CPU" in chosen.why and "real weights" in chosen.lines()[0]


def test_the_environment_names_a_shape_that_loads_with_random_weights_and_real_timings(monkeypatch):
    monkeypatch.setenv(cm.MODEL_ENV, "SmolLM2-135M")
    chosen = cm.course_model(device="cpu")
    assert chosen.engine_args == {"model": "SmolLM2-135M", "load_format": "dummy"}
    assert not chosen.real_weights and "the text is noise" in chosen.lines()[0]
    assert "$MINIENG_MODEL" in chosen.why
    engine = LLMEngine(**chosen.engine_args, device="cpu", kv_cache_memory_gib=0.1, max_model_len=256)
    assert engine.model_config.num_hidden_layers == 30 and engine.tokenizer is not None
    out = engine.generate("Hello", SamplingParams.fixed_length(4))[0]
    assert len(out.token_ids) == 4  # random weights decode: timings are real, the text is noise


def test_a_notebook_model_beats_the_environment_and_a_path_loads_as_given(monkeypatch, tmp_path):
    monkeypatch.setenv(cm.MODEL_ENV, "SmolLM2-135M")
    chosen = cm.course_model(str(tmp_path))
    assert chosen.engine_args == {"model": str(tmp_path)} and chosen.real_weights


def test_the_real_checkpoint_only_when_the_reader_allowed_downloads(monkeypatch):
    fetched = []
    monkeypatch.setattr(cm, "resolve_model_dir", lambda model: fetched.append(model))
    assert not cm.course_model("SmolLM2-1.7B").real_weights and fetched == []  # HF_HUB_OFFLINE=1: no download
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    chosen = cm.course_model("SmolLM2-1.7B")
    assert fetched == ["HuggingFaceTB/SmolLM2-1.7B-Instruct"]
    assert chosen.real_weights and chosen.engine_args == {"model": "HuggingFaceTB/SmolLM2-1.7B-Instruct"}


def test_a_download_that_fails_falls_back_to_random_weights_and_says_why(monkeypatch):
    def refuse(model):
        raise ValueError("the Hub cannot be reached")

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(cm, "resolve_model_dir", refuse)
    chosen = cm.course_model("SmolLM2-1.7B")
    assert not chosen.real_weights and chosen.engine_args["load_format"] == "dummy"
    assert "could not be downloaded: the Hub cannot be reached" in chosen.why


def test_the_gpu_branch_times_the_embedded_model_and_chooses_a_shape(monkeypatch):
    """The GPU branch, run on this CPU: the probe's measured step sets the fixed cost per layer, and the
    choice reads a simulated 16 GB device at 320 GB/s (a T4)."""
    monkeypatch.setattr(cm, "_is_cuda", lambda device: True)
    monkeypatch.setattr(cm, "device_free_bytes", lambda device: 15 * 10**9)
    with pytest.raises(ValueError, match="bandwidth_gbps"):
        cm.course_model(device="cpu")
    chosen = cm.course_model(bandwidth_gbps=320, device="cpu")
    assert chosen.choice is not None and chosen.name == chosen.choice.name
    assert chosen.choice.weight_bytes <= 0.4 * 15e9
    assert chosen.probe_engine is not None and chosen.probe_engine.model_config.num_hidden_layers == 30
    assert not chosen.real_weights and chosen.text_engine(object()) is chosen.probe_engine
    assert chosen.choice.reason() in chosen.why


def test_text_comes_from_the_lesson_engine_when_its_weights_are_real():
    chosen = cm.course_model(device="cpu")
    engine = object()
    assert chosen.text_engine(engine) is engine
