"""Tensor parallelism on paper (claim S4, notebook 11): the article's model split over RTX 3060s, and
this machine's model over two devices like this one, from ``tp_estimate.tensor_parallel_decode``.
Computed, not measured: ``tensor_parallel.measure_tensor_parallel`` measures the split.
"""

from __future__ import annotations

from minieng.measure.roofline import format_percent
from minieng.measure.tp_estimate import LINKS, TensorParallelStep, tensor_parallel_decode

# The SXM boards that talk over NVLink; every other GPU pair talks over PCIe 4.0 x16.
NVLINK_BOARDS = {"H100 SXM": "nvlink4", "H200": "nvlink4", "A100 80GB SXM": "nvlink3"}


def article_cases(article: dict, hop_latency_s: float) -> dict[str, TensorParallelStep]:
    """The article's model (``article``: ``tensor_parallel_decode``'s weight_bytes, num_layers,
    hidden_size, bandwidth_gbps) on one card, and on two over an ideal link, PCIe 4.0 x16 and x8."""
    two = dict(num_devices=2, latency_s=hop_latency_s, **article)
    return {
        "one RTX 3060": tensor_parallel_decode(num_devices=1, **article),
        "two, an ideal link": tensor_parallel_decode(num_devices=2, **article),
        "two, PCIe 4.0 x16": tensor_parallel_decode(link=LINKS["pcie4_x16"], **two),
        "two, PCIe 4.0 x8 (x8/x8 slots)": tensor_parallel_decode(link=LINKS["pcie4_x8"], **two),
    }


def format_cases(cases: dict[str, TensorParallelStep]) -> list[str]:
    """``article_cases`` as a table (step, tok/s, read, the link's latency and bytes, its share)."""
    lines = [
        f"{'':<32} {'step ms':>8} {'tok/s':>7} {'read ms':>8} {'link: latency':>14} {'+ bytes':>9} {'link share':>11}   [computed]"
    ]
    lines += [
        f"{name:<32} {s.step_s * 1e3:>8.2f} {s.tok_s:>7.1f} {s.read_s * 1e3:>8.2f} {s.allreduce_latency_s * 1e3:>11.3f} ms "
        f"{s.allreduce_transfer_s * 1e3:>6.3f} ms {format_percent(100 * s.link_share):>11}"
        for name, s in cases.items()
    ]
    pcie = cases["two, PCIe 4.0 x16"]
    lines.append(
        f"\n{pcie.num_allreduces} all-reduces per step of {pcie.allreduce_bytes / 1024:.0f} KiB each (batch 1): the link "
        f"costs {pcie.link_s * 1e3:.2f} ms per token, {pcie.allreduce_latency_s / pcie.link_s:.0%} of it latency"
    )
    return lines


def ceilings_by_link(article: dict, hop_latency_s: float, devices: list[int]) -> dict[str, list[float]]:
    """Per sequence tok/s of the article's model split over each count of ``devices``, per link."""
    links = {"ideal link": None, "PCIe 4.0 x16": LINKS["pcie4_x16"], "PCIe 3.0 x16": LINKS["pcie3_x16"]}
    return {
        name: [
            tensor_parallel_decode(num_devices=p, link=link, latency_s=hop_latency_s, **article).tok_s for p in devices
        ]
        for name, link in links.items()
    }


def twin_split(
    shape: dict, device_name: str | None, hop_latency_s: float
) -> tuple[TensorParallelStep, TensorParallelStep, str]:
    """A model (``shape``: ``tensor_parallel_decode``'s keyword arguments but the devices and link) on
    one device and on two of them over the link such a board has (``NVLINK_BOARDS``, else PCIe 4.0
    x16). Returns (one device, two devices, a sentence saying which is faster)."""
    link = LINKS[NVLINK_BOARDS.get(device_name or "", "pcie4_x16")]
    alone = tensor_parallel_decode(num_devices=1, **shape)
    split = tensor_parallel_decode(num_devices=2, link=link, latency_s=hop_latency_s, **shape)
    words = (
        f"this model on one device like this one: floor {alone.step_s * 1e3:.3f} ms; on two over {link.name}: read "
        f"{split.read_s * 1e3:.3f} ms + link {split.link_s * 1e3:.3f} ms = {split.step_s * 1e3:.3f} ms [computed]\n"
    )
    if split.step_s < alone.step_s:
        words += f"tensor parallelism would speed its floor up {alone.step_s / split.step_s:.2f}x"
    else:
        words += f"tensor parallelism would slow it down: {split.step_s / alone.step_s:.1f}x the one-device floor"
    return alone, split, words


def split_words(article: dict, link: str, devices: int, batch_size: int, hop_latency_us: float) -> str:
    """The article's model over ``devices`` RTX 3060s on ``link`` (a ``LINKS`` key, else ideal): one
    line of the step's parts, tok/s and the link's share, against one card."""
    one = tensor_parallel_decode(num_devices=1, batch_size=batch_size, **article)
    s = tensor_parallel_decode(
        num_devices=devices, link=LINKS.get(link), latency_s=hop_latency_us * 1e-6, batch_size=batch_size, **article
    )
    over = LINKS[link].name if link in LINKS else "an ideal link"
    return (
        f"{devices} x RTX 3060 over {over}, batch {batch_size}: step {s.step_s * 1e3:.2f} ms = read "
        f"{s.read_s * 1e3:.2f} + link latency {s.allreduce_latency_s * 1e3:.3f} + link bytes "
        f"{s.allreduce_transfer_s * 1e3:.3f} ms; {s.tok_s:.1f} tok/s per sequence, {batch_size * s.tok_s:,.0f} tok/s "
        f"in all; the link is {format_percent(100 * s.link_share)} of the step ({one.step_s / s.step_s:.2f}x one card) "
        "[computed]"
    )
