"""A Llama-family decoder (Llama 2/3, SmolLM2, Mistral, Qwen2/2.5) over the paged KV cache.

Read bottom-up: RMSNorm, rotary embeddings, attention, MLP, the decoder layer, the model. The
forward takes the whole step flattened to ``num_tokens`` rows (prefill chunks and decodes
together), so every linear layer is one matrix product over the batch; only attention looks at
which row is whose (``attention.py``). Weights keep Hugging Face's names, but q/k/v and gate/up
are stacked (``qkv_proj``, ``gate_up_proj``, as vLLM's): one product instead of three or two.
"""

from __future__ import annotations

import platform
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from minieng.config import ModelConfig
from minieng.core.attention import AttentionMetadata, paged_attention, sdpa_backends
from minieng.core.kv_cache import KVCache, LayerKV, write_kv


ONEDNN_LINEAR = (  # oneDNN's product for float32 on x86-64 CPUs (``linear``)
    platform.machine().lower() in ("x86_64", "amd64")
    and torch.backends.mkldnn.is_available()
    and hasattr(torch.ops.mkldnn, "_linear_pointwise")
)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [rows, in] @ weight [out, in].T + bias -> [rows, out], as ``torch.nn.functional.linear``.

    On an x86-64 CPU in float32 the product runs in oneDNN (``torch.ops.mkldnn._linear_pointwise``,
    the op torch.compile's CPU backend emits) rather than MKL's sgemm, whose small-M GEMM reads the
    weights well below the copy bandwidth: about 0.6x sgemm's time at batch 1 on a 2-core EPYC
    (docs/measurements.md). Everywhere else, and inside code being compiled, ``F.linear``.
    """
    if ONEDNN_LINEAR and x.device.type == "cpu" and x.dtype == torch.float32 and x.dim() == 2:
        if not torch.compiler.is_compiling():
            # The op itself rather than its packet, whose call checks its arguments in Python
            # first (121 calls a decode step).
            return torch.ops.mkldnn._linear_pointwise.default(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


class Linear(nn.Module):
    """y = x @ weight.T + bias, ``weight`` [out_features, in_features] as ``torch.nn.Linear``'s."""

    def __init__(self, in_features: int, out_features: int, bias: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight (Zhang & Sennrich 2019), in one op (``F.rms_norm``)."""

    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


class RotaryEmbedding(nn.Module):
    """RoPE (Su et al. 2021) as one complex product per layer.

    Each head's q and k dimensions are stored interleaved, i next to i + head_dim / 2
    (``interleave_rope_rows`` at load; q·k is unchanged), so a rotated pair is one complex number:
    ``x * e^(i·position·freq)``, one multiplication where transformers' rotate-half takes four ops.
    Scaled variants' inverse frequencies (Llama 3.1's "llama3", "yarn", ...) come from transformers.
    ``freqs_cis`` [max_position, head_dim / 2] complex64: a plain attribute, not a buffer, so that
    casting the model leaves it complex; it follows the positions' device (``tables``).
    """

    def __init__(self, config: ModelConfig, max_position: int, device: torch.device | str = "cpu"):
        super().__init__()
        with torch.device("cpu"):  # computed, never loaded: not on the meta device of a lazy build
            inv_freq, scaling = _rope_inv_freq(config)
            angles = torch.outer(torch.arange(max_position, dtype=torch.float32), inv_freq)
            self.freqs_cis = torch.polar(torch.full_like(angles, scaling), angles).to(device)
        self.max_position = max_position
        self.num_qk_heads = config.num_attention_heads + config.num_key_value_heads
        self.num_v_heads = config.num_key_value_heads

    def tables(self, positions: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Each token's rotation for every head of the qkv product, 1 for the V heads (so K and V
        stay side by side, for one write into the pool); once per step, shared by every layer.
        float32: [num_tokens, q + k + v heads, head_dim / 2] complex64. Another ``dtype``: rotation
        matrices [..., 2, 2] in it, [[cos, sin], [-sin, cos]] (complex bfloat16 does not exist)."""
        if self.freqs_cis.device != positions.device:  # a model moved after it was built: once
            self.freqs_cis = self.freqs_cis.to(positions.device)
        f = self.freqs_cis[positions][:, None]  # [n, 1, D / 2]
        n, half = f.shape[0], f.shape[-1]
        one = torch.ones((), dtype=f.dtype, device=f.device)
        table = torch.cat((f.expand(n, self.num_qk_heads, half), one.expand(n, self.num_v_heads, half)), dim=1)
        if dtype == torch.float32:
            return table
        cos, sin = table.real, table.imag
        return torch.stack((torch.stack((cos, sin), -1), torch.stack((-sin, cos), -1)), -2).to(dtype)


def apply_rope(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """x: [num_tokens, heads, head_dim / 2, 2] (interleaved pairs) rotated by ``table``
    (``RotaryEmbedding.tables``), in one op: a complex product in float32, a product of rotation
    matrices in another dtype, or, given a complex table's ``view_as_real`` (for code generators
    that take no complex tensors, such as inductor), the same rotation in float32 reals."""
    if table.dim() == x.dim() + 1:  # rotation matrices in x's dtype: (x0, x1) @ [[cos, sin], [-sin, cos]]
        return (x.unsqueeze(-2) @ table).squeeze(-2)
    if not table.is_complex():  # its (cos, sin) pairs [..., 2]: the same product in reals
        cos, sin = table.unbind(-1)
        x0, x1 = x.float().unbind(-1)
        return torch.stack((x0 * cos - x1 * sin, x1 * cos + x0 * sin), dim=-1).to(x.dtype)
    if x.dtype == torch.float32:
        return torch.view_as_real(torch.view_as_complex(x) * table)
    return torch.view_as_real(torch.view_as_complex(x.float()) * table).to(x.dtype)  # a complex table, any dtype


def interleave_rope_rows(weight: torch.Tensor, head_dim: int) -> torch.Tensor:
    """q_proj/k_proj rows (or biases) reordered per head from rotate-half's layout (dimension i
    pairs with i + head_dim / 2) to interleaved pairs (2i, 2i + 1): rows [heads * head_dim, ...]."""
    half = head_dim // 2
    order = torch.stack((torch.arange(half), torch.arange(half) + half), dim=1).flatten()
    return weight.view(-1, head_dim, *weight.shape[1:])[:, order].reshape(weight.shape)


def _rope_inv_freq(config: ModelConfig) -> tuple[torch.Tensor, float]:
    hf = config.hf_config
    params = getattr(hf, "rope_parameters", None) or getattr(hf, "rope_scaling", None) or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # lazy: only scaled RoPE needs it

        inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](hf, device="cpu")
        return inv_freq.float(), float(scaling)
    theta = params.get("rope_theta", getattr(hf, "rope_theta", 10000.0))
    dim = config.head_dim
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)), 1.0


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, qkv_bias: bool, o_bias: bool):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.qkv_proj = Linear(config.hidden_size, self.q_size + 2 * self.kv_size, qkv_bias)
        self.o_proj = Linear(self.q_size, config.hidden_size, o_bias)

    def project(self, x: torch.Tensor, rope: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q [n, heads, head_dim / 2, 2] and kv [n, 2 kv_heads, head_dim / 2, 2]: the qkv product,
        each head's dimensions as RoPE's pairs, q and k rotated (v by 1) in one product."""
        n = x.shape[0]
        qkv = apply_rope(self.qkv_proj(x).view(n, -1, self.head_dim // 2, 2), rope)
        q, kv = qkv.split([self.num_heads, 2 * self.num_kv_heads], dim=1)
        return q, kv


class MLP(nn.Module):
    """SwiGLU (Shazeer 2020): down(silu(gate(x)) * up(x))."""

    def __init__(self, config: ModelConfig, bias: bool):
        super().__init__()
        self.intermediate_size = config.intermediate_size
        self.gate_up_proj = Linear(config.hidden_size, 2 * config.intermediate_size, bias)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate_size, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, qkv_bias: bool, o_bias: bool, mlp_bias: bool):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, qkv_bias, o_bias)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config, mlp_bias)

    # Three parts: the dense ones around attention's paged K/V write and read may be replaced.

    def before_attention(self, x: torch.Tensor, rope: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """RMSNorm, the qkv product and RoPE: q and kv (``Attention.project``)."""
        return self.self_attn.project(self.input_layernorm(x), rope)

    def after_attention(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """The output product and the residual, RMSNorm, the MLP and its residual."""
        x = x + self.self_attn.o_proj(attn)
        return x + self.mlp(self.post_attention_layernorm(x))

    def forward(
        self, x: torch.Tensor, rope: torch.Tensor, kv_cache: LayerKV, meta: AttentionMetadata, regions=None
    ) -> torch.Tensor:
        """``regions``: functions ``(before_attention, after_attention)`` to run in place of the
        methods (called with the layer first), or None."""
        before, after = regions or (DecoderLayer.before_attention, DecoderLayer.after_attention)
        q, kv = before(self, x, rope)
        write_kv(kv_cache, kv, meta.slot_mapping)
        return after(self, x, paged_attention(q, kv_cache.blocks, meta))


class LlamaForCausalLM(nn.Module):
    """The decoder stack and the LM head. ``forward`` returns logits only where asked."""

    def __init__(self, config: ModelConfig, max_position: int | None = None):
        super().__init__()
        self.config = config
        hf = config.hf_config
        # Qwen2 has q/k/v biases; Llama's optional attention_bias covers q/k/v and o.
        qkv_bias = config.model_type == "qwen2" or bool(getattr(hf, "attention_bias", False))
        o_bias = config.model_type != "qwen2" and bool(getattr(hf, "attention_bias", False))
        mlp_bias = bool(getattr(hf, "mlp_bias", False))
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(config, qkv_bias, o_bias, mlp_bias) for _ in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()
        self.rope = RotaryEmbedding(config, max_position or config.max_position_embeddings)

    def tie_weights(self) -> None:  # the LM head is the embedding matrix itself, where the model ties them
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_cache: KVCache,
        meta: AttentionMetadata,
        logits_indices: torch.Tensor,
        regions=None,
    ) -> torch.Tensor:
        """One step: ``input_ids``, ``positions`` [num_tokens] int64 (decodes first), this step's K/V
        written into ``kv_cache`` where ``meta`` (``attention.build_metadata``) says. Returns the
        logits [num_logits, vocab] float32 of the rows ``logits_indices`` asks for (each decode,
        a prompt's last row). ``regions``: as ``DecoderLayer.forward``'s."""
        x = self.embed_tokens(input_ids)  # [num_tokens, hidden]
        rope = self.rope.tables(positions, x.dtype if regions is None else torch.float32)  # replaced parts: float32
        with sdpa_backends(x.device):
            for layer, layer_kv in zip(self.layers, kv_cache.layers):
                x = layer(x, rope, layer_kv, meta, regions)
        if logits_indices.numel() == 0:
            # No product on zero rows (a prompt's first chunks): CUDA kernels fail on an empty grid.
            return x.new_empty(0, self.config.vocab_size, dtype=torch.float32)
        x = self.norm(x[logits_indices])  # the LM head only runs where logits are needed
        return self.lm_head(x).float()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy Hugging Face-named tensors in, stacking q/k/v and gate/up, each of its parameter's
        shape. Raises ``ValueError`` for a name the model does not have or a parameter left unloaded."""
        params = dict(self.named_parameters())
        attn = self.layers[0].self_attn if len(self.layers) else None
        stacked = {  # checkpoint suffix -> (our suffix, offset of the shard along the output dim)
            "q_proj": ("qkv_proj", 0),
            "k_proj": ("qkv_proj", attn.q_size if attn else 0),
            "v_proj": ("qkv_proj", (attn.q_size + attn.kv_size) if attn else 0),
            "gate_proj": ("gate_up_proj", 0),
            "up_proj": ("gate_up_proj", self.layers[0].mlp.intermediate_size if len(self.layers) else 0),
        }
        loaded = set()
        for name, tensor in weights:
            name = name.removeprefix("model.")
            if "rotary_emb" in name or (name == "lm_head.weight" and self.config.tie_word_embeddings):
                continue
            module, _, leaf = name.rpartition(".")
            parent, _, proj = module.rpartition(".")
            target, offset = name, 0
            if proj in stacked:
                ours, offset = stacked[proj]
                target = f"{parent}.{ours}.{leaf}"
            if target not in params:
                raise ValueError(f"checkpoint tensor {name!r} has no place in the model")
            dest = params[target].data
            if proj in ("q_proj", "k_proj"):  # RoPE's pairs interleaved (RotaryEmbedding)
                tensor = interleave_rope_rows(tensor, self.config.head_dim)
            if proj in stacked:  # a shard of the output dimension (the first one)
                dest = dest[offset : offset + tensor.shape[0]]
            if dest.shape != tensor.shape:
                raise ValueError(
                    f"{name}: checkpoint shape {tuple(tensor.shape)} != model shape {tuple(dest.shape)}; wrong config?"
                )
            dest.copy_(tensor)
            loaded.add((target, offset))
        parts = {name: [off for ours, off in stacked.values() if ours == name.split(".")[-2]] or [0] for name in params}
        expected = {(name, off) for name, offsets in parts.items() for off in offsets}
        missing = sorted(p for p, _ in expected - loaded)
        if missing:
            raise ValueError(f"checkpoint lacks {len(missing)} tensors, e.g. {missing[:3]}")
