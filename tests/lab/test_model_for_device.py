"""The model each notebook measures: the embedded default on a CPU, a published shape chosen for a GPU,
a shape's random weights when downloads are not allowed, and real weights wherever text matters."""

from __future__ import annotations

import pytest

import minieng.lab.model_for_device as cm
from minieng import LLMEngine, SamplingParams
from minieng.config import DEFAULT_MODEL_NAME
from minieng.measure.peaks import Peak

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


def test_the_real_checkpoint_only_when_the_reader_allowed_downloads(monkeypatch, tmp_path):
    fetched = []
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 3_000_000)
    monkeypatch.setattr(cm, "_cached_checkpoint", lambda hub_id: None)
    monkeypatch.setattr(cm, "resolve_model_dir", lambda model: fetched.append(model) or tmp_path)
    assert not cm.course_model("SmolLM2-1.7B").real_weights and fetched == []  # HF_HUB_OFFLINE=1: no download
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    chosen = cm.course_model("SmolLM2-1.7B")
    assert fetched == ["HuggingFaceTB/SmolLM2-1.7B-Instruct"]
    assert chosen.real_weights and chosen.engine_args == {"model": "HuggingFaceTB/SmolLM2-1.7B-Instruct"}
    # The lesson says it measures the real checkpoint, and prints the download's size and time once, in its lines.
    assert chosen.lines()[0] == "model: HuggingFaceTB/SmolLM2-1.7B-Instruct (real weights)"
    assert "downloaded from the Hugging Face Hub: 0.00 GB in" in chosen.lines()[1]


def test_a_checkpoint_already_in_the_local_cache_is_not_downloaded_again(monkeypatch, tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 10)
    monkeypatch.setattr(cm, "_cached_checkpoint", lambda hub_id: tmp_path)
    monkeypatch.setattr(cm, "resolve_model_dir", lambda model: pytest.fail("downloaded a cached checkpoint"))
    path, line = cm.fetch_checkpoint("HuggingFaceTB/SmolLM2-1.7B-Instruct")
    assert path == tmp_path and line.endswith("read from the local Hugging Face cache")


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


# -- notebook 09's pair ---------------------------------------------------------------------------------------


def test_on_a_cpu_the_pair_is_the_embedded_model_and_its_int8_self_draft():
    pair = cm.course_speculative_pair(device="cpu")
    assert pair.engine_args == {"speculative_method": "draft", "draft_quantization": "int8"}
    assert not pair.on_gpu and pair.prediction is None and pair.predicted_c is None
    assert pair.name == f"target the embedded {DEFAULT_MODEL_NAME}, draft the same weights in int8"
    engine = LLMEngine(
        **pair.engine_args, num_speculative_tokens=1, device="cpu", kv_cache_memory_gib=0.1, max_model_len=256
    )
    assert engine.drafter is not None


def gpu_on_this_cpu(monkeypatch, free_bytes=15 * 10**9):
    """The GPU branch, run on this CPU: a simulated device in fp16 with ``free_bytes`` free."""
    monkeypatch.setattr(cm, "_is_cuda", lambda device: True)
    monkeypatch.setattr(cm, "device_free_bytes", lambda device: free_bytes)
    monkeypatch.setattr(cm, "dtype_choice", lambda device: ("float16", "a simulated GPU"))


T4 = Peak("T4", 65, 320, "datasheet")


def test_offline_on_a_gpu_the_pair_refuses_random_weights_and_says_how_to_allow_downloads(monkeypatch):
    gpu_on_this_cpu(monkeypatch)
    monkeypatch.setattr(cm, "_cached_checkpoint", lambda hub_id: None)
    monkeypatch.setattr(cm, "LLMEngine", lambda **kw: pytest.fail("timed a probe before refusing"))
    with pytest.raises(ValueError, match="HF_HUB_OFFLINE=0") as refused:
        cm.course_speculative_pair(T4, device="cpu")
    assert "random weights" in str(refused.value) and "HuggingFaceTB/SmolLM2-135M-Instruct" in str(refused.value)
    with pytest.raises(ValueError, match="needs peak"):
        cm.course_speculative_pair(device="cpu")


def test_on_a_gpu_the_pair_is_chosen_by_the_napkin_model_and_its_checkpoints_downloaded(monkeypatch, tmp_path):
    """A T4's 15 GB: the SmolLM2 pair (the Qwen pair's 7.2 GB of weights pass 40% of it), c predicted first."""
    gpu_on_this_cpu(monkeypatch)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    fetched = []

    def fetch(hub_id):
        fetched.append(hub_id)
        return tmp_path / hub_id, f"{hub_id}, downloaded"

    monkeypatch.setattr(cm, "fetch_checkpoint", fetch)
    pair = cm.course_speculative_pair(T4, device="cpu", fixed_cost_per_layer_s=20e-6)
    assert fetched == ["HuggingFaceTB/SmolLM2-1.7B-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"]
    assert (
        pair.on_gpu
        and pair.name == "target HuggingFaceTB/SmolLM2-1.7B-Instruct, draft HuggingFaceTB/SmolLM2-135M-Instruct"
    )
    assert pair.engine_args == {
        "model": str(tmp_path / fetched[0]),
        "speculative_method": "draft",
        "draft_model": str(tmp_path / fetched[1]),
    }
    assert pair.prediction.pays and 0 < pair.predicted_c < 0.3
    text = "\n".join(pair.lines())
    assert f"predicted c = draft step / target step = {pair.predicted_c:.2f}" in text
    assert "30 layers x 20 µs" in text and "weights: HuggingFaceTB/SmolLM2-1.7B-Instruct, downloaded" in text


def test_offline_a_pair_in_the_local_cache_is_used_as_it_is(monkeypatch, tmp_path):
    """No downloads allowed, but the SmolLM2 pair cached: that pair, from its folders, even where the Qwen
    pair would fit."""
    gpu_on_this_cpu(monkeypatch, free_bytes=80 * 10**9)
    cached = {
        "HuggingFaceTB/SmolLM2-1.7B-Instruct": tmp_path / "t",
        "HuggingFaceTB/SmolLM2-135M-Instruct": tmp_path / "d",
    }
    monkeypatch.setattr(cm, "_cached_checkpoint", cached.get)
    monkeypatch.setattr(cm, "fetch_checkpoint", lambda hub_id: pytest.fail("fetched offline"))
    pair = cm.course_speculative_pair(Peak("H100 SXM", 989, 3350, "datasheet"), device="cpu", fixed_cost_per_layer_s=0)
    assert (pair.engine_args["model"], pair.engine_args["draft_model"]) == (str(tmp_path / "t"), str(tmp_path / "d"))
    assert all(line.endswith("read from the local Hugging Face cache") for line in pair.fetched)


def test_the_pair_times_the_fixed_cost_on_the_device_when_not_given(monkeypatch, tmp_path):
    """The probe's step on this CPU, read against a T4's 320 GB/s, is almost all fixed cost: c then follows
    the layers, no pair's draft is cheap enough, and the lines say speculation can gain little."""
    gpu_on_this_cpu(monkeypatch)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(cm, "fetch_checkpoint", lambda hub_id: (tmp_path, f"{hub_id}, downloaded"))
    pair = cm.course_speculative_pair(T4, device="cpu")
    assert pair.prediction.fixed_cost_per_layer_s > 0 and cm.PROBE_NOTE in pair.why
    assert not pair.prediction.pays and "can gain little" in "\n".join(pair.lines())


def test_the_primer_draws_the_lesson_models_shape_from_a_config_alone(monkeypatch):
    cpu = cm.lesson_shape(device="cpu")  # the embedded default: what a CPU's lessons measure
    assert cpu.name == DEFAULT_MODEL_NAME and cpu.config.num_hidden_layers == 30 and "CPU" in cpu.why
    named = cm.lesson_shape("Llama-3-8B", device="cuda")  # a published shape: its config, no weights
    assert named.name == "Llama-3-8B" and named.config.num_hidden_layers == 32 and "lessons measure" in named.why
    monkeypatch.setenv(cm.MODEL_ENV, "meta-llama/Meta-Llama-3-8B-Instruct")  # its checkpoint's Hub id
    assert cm.lesson_shape(device="cuda").config.num_key_value_heads == 8
    monkeypatch.delenv(cm.MODEL_ENV)
    gpu = cm.lesson_shape(device="cuda")  # chosen from a timed step on a GPU: no config says which
    assert gpu.name == DEFAULT_MODEL_NAME and "chooses a larger model" in gpu.why
    unknown = cm.lesson_shape("someone/some-model", device="cpu")
    assert unknown.name == DEFAULT_MODEL_NAME and "someone/some-model's needs its checkpoint" in unknown.why
