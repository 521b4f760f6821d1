"""Notebook 11's tensor parallelism on paper: the article's model over RTX 3060s, and a model over
two devices like this one."""

from __future__ import annotations

import pytest

from minieng.lab.tp_paper import article_cases, ceilings_by_link, format_cases, split_words, twin_split

ARTICLE = dict(weight_bytes=10.8e9, num_layers=40, hidden_size=5120, bandwidth_gbps=360)


def test_article_cases_halve_the_read_and_pay_the_link():
    cases = article_cases(ARTICLE, 5e-6)
    one, ideal, pcie = cases["one RTX 3060"], cases["two, an ideal link"], cases["two, PCIe 4.0 x16"]
    assert one.tok_s == pytest.approx(360 / 10.8)  # the article's ~33 tok/s
    assert ideal.tok_s == pytest.approx(2 * one.tok_s)  # ~66 with a free link
    assert one.tok_s < pcie.tok_s < ideal.tok_s  # less in practice
    assert pcie.allreduce_latency_s > pcie.allreduce_transfer_s  # at batch 1 the toll is latency
    lines = format_cases(cases)
    assert len(lines) == len(cases) + 2 and "of it latency" in lines[-1]


def test_ceilings_by_link_grow_less_than_the_devices():
    curves = ceilings_by_link(ARTICLE, 5e-6, [1, 2, 4])
    assert curves["ideal link"] == pytest.approx([c * 360 / 10.8 for c in (1, 2, 4)])
    assert curves["PCIe 4.0 x16"][2] < 4 * curves["PCIe 4.0 x16"][0]


def test_twin_split_slows_a_small_model_and_speeds_a_large_one():
    small = dict(weight_bytes=0.3e9, num_layers=30, hidden_size=576, bandwidth_gbps=3350, activation_bytes=2)
    alone, split, words = twin_split(small, "H100 SXM", 5e-6)
    assert split.step_s > alone.step_s and "slow it down" in words and "NVLink" in words
    alone, split, words = twin_split(ARTICLE, None, 5e-6)
    assert split.step_s < alone.step_s and "speed its floor up" in words and "PCIe 4.0 x16" in words


def test_split_words_name_the_link_and_the_gain():
    assert "an ideal link" in split_words(ARTICLE, "ideal", 2, 1, 5) and "(2.00x one card)" in split_words(
        ARTICLE, "ideal", 2, 1, 5
    )
    assert "PCIe 4.0 x16" in split_words(ARTICLE, "pcie4_x16", 2, 1, 5)
