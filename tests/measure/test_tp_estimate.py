"""parallel: tensor parallelism on paper, against the seed's RTX 3060 arithmetic and by hand."""

from __future__ import annotations

import pytest

from minieng.measure.tp_estimate import LINKS, Link, allreduce_s, tensor_parallel_decode

# The seed's example: 10.8 GB of weights on RTX 3060s (360 GB/s). It names no model; a Llama-2-13B
# shape (40 layers, hidden 5120) at ~6.6 bits per weight fits its 10.8 GB.
SEED = dict(weight_bytes=10.8e9, num_layers=40, hidden_size=5120, bandwidth_gbps=360)


def test_one_device_is_bytes_over_bandwidth():
    one = tensor_parallel_decode(num_devices=1, **SEED)
    assert one.step_s == pytest.approx(0.030) and one.tok_s == pytest.approx(33.3, abs=0.1)  # the seed's ~33
    assert one.num_allreduces == 0 and one.link_s == 0 and one.link_share == 0


def test_two_devices_over_a_free_link_double_the_ceiling():
    two = tensor_parallel_decode(num_devices=2, **SEED)
    assert two.tok_s == pytest.approx(66.7, abs=0.1)  # the seed's ~66
    assert two.num_allreduces == 80 and two.allreduce_bytes == 5120 * 2 and two.link_s == 0


def test_a_pcie_link_costs_latency_more_than_bandwidth_at_batch_1():
    two = tensor_parallel_decode(num_devices=2, link=LINKS["pcie4_x16"], latency_s=5e-6, **SEED)
    # 80 all-reduces of 10 KiB, each 2 hops of 5 us and 5 KiB at 31.5 GB/s
    assert two.allreduce_latency_s == pytest.approx(80 * 2 * 5e-6)
    assert two.allreduce_transfer_s == pytest.approx(80 * 2 * 5120 / 31.5e9)
    assert two.step_s == pytest.approx(0.015 + 0.0008 + 80 * 2 * 5120 / 31.5e9)
    assert two.allreduce_latency_s > 10 * two.allreduce_transfer_s
    assert 60 < two.tok_s < 66.7 and two.link_share == pytest.approx(two.link_s / two.step_s)


def test_bandwidth_matters_once_the_batch_is_large():
    slow = tensor_parallel_decode(num_devices=2, link=LINKS["pcie3_x16"], latency_s=5e-6, batch_size=256, **SEED)
    fast = tensor_parallel_decode(num_devices=2, link=LINKS["nvlink3"], latency_s=5e-6, batch_size=256, **SEED)
    assert slow.allreduce_bytes == 256 * 5120 * 2
    assert slow.allreduce_transfer_s > slow.allreduce_latency_s > 0
    assert fast.allreduce_transfer_s == pytest.approx(slow.allreduce_transfer_s * 15.75 / 300)


def test_more_devices_divide_the_read_but_not_the_toll():
    steps = [
        tensor_parallel_decode(num_devices=p, link=LINKS["pcie4_x16"], latency_s=5e-6, **SEED) for p in (1, 2, 4, 8)
    ]
    reads = [s.read_s for s in steps]
    assert reads == pytest.approx([0.03 / p for p in (1, 2, 4, 8)])
    tolls = [s.link_s for s in steps]
    assert tolls[1] < tolls[2] < tolls[3]  # 2 (p - 1) hops per all-reduce
    speedups = [steps[0].step_s / s.step_s for s in steps]
    assert all(a < b for a, b in zip(speedups, speedups[1:])) and speedups[3] < 8


def test_kv_bytes_are_split_like_the_weights():
    with_kv = tensor_parallel_decode(num_devices=2, kv_bytes=1.2e9, **SEED)
    assert with_kv.read_s == pytest.approx(12e9 / 2 / 360e9)


def test_allreduce_by_hand_and_bad_inputs():
    assert allreduce_s(1000, 1, 10, 1e-6) == (0.0, 0.0)
    assert allreduce_s(1000, 4, 10, 1e-6) == pytest.approx((6e-6, 6 * 250 / 10e9))
    for bad in (dict(nbytes=-1), dict(num_devices=0), dict(link_bandwidth_gbps=0), dict(latency_s=-1)):
        with pytest.raises(ValueError):
            allreduce_s(**(dict(nbytes=1000, num_devices=2, link_bandwidth_gbps=10, latency_s=0) | bad))
    for bad in (dict(num_devices=0), dict(bandwidth_gbps=0), dict(weight_bytes=-1), dict(latency_s=-1)):
        with pytest.raises(ValueError):
            tensor_parallel_decode(**(SEED | dict(num_devices=2) | bad))
    assert isinstance(LINKS["pcie4_x16"], Link) and LINKS["pcie4_x16"].bandwidth_gbps == 31.5


@pytest.mark.parametrize("num_devices", [2, 4])
def test_fit_link_recovers_the_latency_and_bandwidth_that_made_the_times(num_devices):
    from minieng.measure.tp_estimate import fit_link

    sizes = [64, 1024, 16384, 262144, 1048576]
    times = [sum(allreduce_s(n, num_devices, 3.0, 40e-6)) for n in sizes]
    link, latency_s = fit_link(sizes, times, num_devices, "test link")
    assert latency_s == pytest.approx(40e-6, rel=1e-6)
    assert link.bandwidth_gbps == pytest.approx(3.0, rel=1e-6) and link.name == "test link"
    # Fed back into the model, the fitted link gives the times it was fitted to.
    assert sum(allreduce_s(4096, num_devices, link.bandwidth_gbps, latency_s)) == pytest.approx(
        sum(allreduce_s(4096, num_devices, 3.0, 40e-6))
    )


def test_fit_link_keeps_a_positive_bandwidth_when_noise_flattens_the_slope():
    from minieng.measure.tp_estimate import fit_link

    link, latency_s = fit_link([64, 1024, 4096], [2e-4, 1.9e-4, 1.95e-4], 2, "noisy")
    assert link.bandwidth_gbps > 0 and latency_s > 0


def test_fit_link_needs_two_sizes_and_two_devices():
    from minieng.measure.tp_estimate import fit_link

    with pytest.raises(ValueError, match="two or more distinct sizes"):
        fit_link([64, 64], [1e-4, 1e-4], 2, "x")
    with pytest.raises(ValueError, match="two or more devices"):
        fit_link([64, 128], [1e-4, 2e-4], 1, "x")
