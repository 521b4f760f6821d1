"""Tensor parallelism on paper: the decode floor of a model split over several devices.

Megatron-LM's split (Shoeybi et al. 2019, section 3): in every layer the attention heads and
the MLP's intermediate columns are divided among p devices, so each device holds, and reads
every step, 1/p of the layer weights and of the KV cache. Each half-layer ends in a partial sum
that the devices add up with an all-reduce: two all-reduces per layer, each carrying the step's
activations, ``batch x hidden x activation bytes``. The LM head and the embedding are split by
vocabulary (as vLLM does), so every weight byte is read by exactly one device.

A decode step then takes, on every device in lockstep (the all-reduces synchronize them):

    step = (weight bytes + KV bytes) / (p x bandwidth)  +  2 x layers x all-reduce(S)

and a ring all-reduce of S bytes over p devices takes 2 (p - 1) hops, each sending S / p bytes
over the link and paying its latency (the alpha-beta model; NCCL's bus bandwidth counts the same
2 (p - 1) / p factor): all-reduce(S) = 2 (p - 1) (latency + S / (p x link bandwidth)).

``tensor_parallel_decode`` adds up what each phase of one step costs. It is a model: it assumes
reads at the full bandwidth, all-reduces that overlap nothing, and devices that never wait for
the host. Its point is the shape: p devices divide the read, the link adds a
fixed toll per layer that p does not divide, so the ceiling grows less than p-fold, and at batch
1 the toll is latency, not bandwidth (a token's activations are kilobytes).

Link bandwidths are the published per-direction figures of the standards; a hop's latency has
no datasheet and is an assumption the caller states.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Link:
    """A device-to-device link: ``bandwidth_gbps`` each way per device (GB/s), and where it comes from."""

    name: str
    bandwidth_gbps: float
    source: str


# Published per-direction bandwidths: PCIe 3.0/4.0 run 8/16 GT/s per lane with 128b/130b coding
# (PCI-SIG), x16 = 15.75/31.5 GB/s; NVLink 3 (A100) and NVLink 4 (H100/H200 SXM) give 600 and 900
# GB/s per GPU in both directions together (NVIDIA datasheets), 300 and 450 each way.
LINKS = {
    "pcie3_x16": Link("PCIe 3.0 x16", 15.75, "PCI-SIG: 8 GT/s x 16 lanes, 128b/130b"),
    "pcie4_x8": Link("PCIe 4.0 x8", 15.75, "PCI-SIG: 16 GT/s x 8 lanes, 128b/130b (two cards in x8/x8 slots)"),
    "pcie4_x16": Link("PCIe 4.0 x16", 31.5, "PCI-SIG: 16 GT/s x 16 lanes, 128b/130b"),
    "nvlink3": Link("NVLink 3 (A100)", 300.0, "NVIDIA A100 datasheet: 600 GB/s, both directions"),
    "nvlink4": Link("NVLink 4 (H100/H200 SXM)", 450.0, "NVIDIA H100 datasheet: 900 GB/s, both directions"),
}


@dataclass(frozen=True)
class TensorParallelStep:
    """One decode step split over ``num_devices``, phase by phase (seconds, per device, in lockstep).

    ``read_s``: each device reading its share of the weights and KV cache. ``allreduce_latency_s``
    and ``allreduce_transfer_s``: the all-reduces' hops and bytes on the link, summed over the
    step's ``num_allreduces`` of ``allreduce_bytes`` each. ``step_s`` is their sum.
    """

    num_devices: int
    read_s: float
    allreduce_latency_s: float
    allreduce_transfer_s: float
    num_allreduces: int
    allreduce_bytes: float

    @property
    def link_s(self) -> float:
        return self.allreduce_latency_s + self.allreduce_transfer_s

    @property
    def step_s(self) -> float:
        return self.read_s + self.link_s

    @property
    def tok_s(self) -> float:
        """Tokens per second of each sequence: 1 / step (its TPOT floor, inverted)."""
        return 1.0 / self.step_s

    @property
    def link_share(self) -> float:
        """The share of the step spent on the link."""
        return self.link_s / self.step_s


def allreduce_s(nbytes: float, num_devices: int, link_bandwidth_gbps: float, latency_s: float) -> tuple[float, float]:
    """(latency, transfer) seconds of a ring all-reduce of ``nbytes`` over ``num_devices``: 2 (p - 1)
    hops of ``nbytes / p`` each. (0, 0) on one device. Raises ``ValueError`` for bad sizes."""
    if nbytes < 0 or num_devices < 1 or link_bandwidth_gbps <= 0 or latency_s < 0:
        raise ValueError(
            f"need nbytes >= 0, num_devices >= 1, link bandwidth > 0 and latency >= 0; got "
            f"{nbytes}, {num_devices}, {link_bandwidth_gbps} GB/s, {latency_s} s"
        )
    hops = 2 * (num_devices - 1)
    return hops * latency_s, hops * nbytes / num_devices / (link_bandwidth_gbps * 1e9)


def tensor_parallel_decode(
    weight_bytes: float,
    num_layers: int,
    hidden_size: int,
    num_devices: int,
    bandwidth_gbps: float,
    link: Link | None = None,
    latency_s: float = 0.0,
    batch_size: int = 1,
    activation_bytes: float = 2,
    kv_bytes: float = 0.0,
) -> TensorParallelStep:
    """One decode step of a model split ``num_devices`` ways (Megatron-style), at the bandwidth floor.

    Args:
        weight_bytes: the bytes a step reads from the weights, all devices together (e.g.
            ``flops_bytes.decode_work(...).weight_bytes``, or the article's 10.8 GB).
        num_layers, hidden_size: the shape, which sets the all-reduces: 2 per layer, each of
            ``batch_size x hidden_size x activation_bytes`` bytes.
        bandwidth_gbps: each device's memory bandwidth (GB/s).
        link: the link between devices; None is an ideal link, whose all-reduces cost nothing.
        latency_s: each hop's fixed cost on ``link`` (s): an assumption, stated by the caller.
        kv_bytes: the KV cache a step reads, all devices together (split like the heads).
    Returns:
        a ``TensorParallelStep``; one device has no all-reduces.
    Raises:
        ValueError: a non-positive size or bandwidth, or a negative latency.
    """
    if weight_bytes < 0 or kv_bytes < 0 or num_layers < 1 or hidden_size < 1 or num_devices < 1 or batch_size < 1:
        raise ValueError(
            f"need bytes >= 0 and layers, hidden size, devices, batch >= 1; got "
            f"weight_bytes={weight_bytes}, kv_bytes={kv_bytes}, num_layers={num_layers}, "
            f"hidden_size={hidden_size}, num_devices={num_devices}, batch_size={batch_size}"
        )
    if bandwidth_gbps <= 0 or activation_bytes <= 0 or latency_s < 0:
        raise ValueError(
            f"need bandwidth > 0, activation bytes > 0 and latency >= 0; got {bandwidth_gbps} GB/s, "
            f"{activation_bytes}, {latency_s} s"
        )
    message = batch_size * hidden_size * activation_bytes
    each_latency, each_transfer = (0.0, 0.0)
    if link is not None:
        each_latency, each_transfer = allreduce_s(message, num_devices, link.bandwidth_gbps, latency_s)
    # Every device, in lockstep, per layer: read its share of the attention weights, all-reduce,
    # read its share of the MLP, all-reduce. How the bytes split between the halves moves no sum.
    allreduces = 2 * num_layers if num_devices > 1 else 0
    return TensorParallelStep(
        num_devices,
        read_s=(weight_bytes + kv_bytes) / num_devices / (bandwidth_gbps * 1e9),
        allreduce_latency_s=allreduces * each_latency,
        allreduce_transfer_s=allreduces * each_transfer,
        num_allreduces=allreduces,
        allreduce_bytes=message if allreduces else 0.0,
    )


def fit_link(sizes_bytes: list[float], times_s: list[float], num_devices: int, name: str) -> tuple[Link, float]:
    """The link, and each hop's latency (s), that ``allreduce_s`` needs to reproduce measured
    all-reduce times: a least-squares line ``t = a + b x S`` through ``(sizes_bytes, times_s)``
    (numpy's ``polyfit``), read through the ring model ``t = 2 (p - 1) (latency + S / (p x bw))``:
    latency = a / 2 (p - 1), bandwidth = 2 (p - 1) / (p x b). A slope that noise made zero or
    negative leaves the largest message's own time as its bandwidth.

    Raises ``ValueError`` for fewer than two distinct sizes, a mismatch of lengths, or fewer than
    two devices.
    """
    if len(sizes_bytes) != len(times_s) or len(set(sizes_bytes)) < 2 or num_devices < 2:
        raise ValueError(
            f"need two or more distinct sizes, one time each, and two or more devices; got {len(sizes_bytes)} "
            f"sizes, {len(times_s)} times, {num_devices} devices"
        )
    hops = 2 * (num_devices - 1)
    slope, intercept = np.polyfit(np.asarray(sizes_bytes, float), np.asarray(times_s, float), 1)
    if slope <= 0:
        i = int(np.argmax(sizes_bytes))
        slope = times_s[i] / sizes_bytes[i]
    latency_s = max(0.0, float(intercept)) / hops
    bandwidth_gbps = hops / (num_devices * float(slope)) / 1e9
    return Link(name, bandwidth_gbps, "measured here: all-reduces of the engine's own group"), latency_s
