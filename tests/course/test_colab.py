"""The notebooks' first cell on Colab allows Hub downloads (``allow_hub_downloads``); anywhere else it changes
nothing. Colab is simulated as its runtime shows itself to the cell: a ``google.colab`` module in sys.modules."""

from __future__ import annotations

import os
import sys
import types

import huggingface_hub
import huggingface_hub.constants
import pytest
import transformers.utils.hub

from minieng.course import allow_hub_downloads, on_colab
from minieng.lab import downloads_allowed


@pytest.fixture
def offline(monkeypatch):
    """The test session's state (HF_HUB_OFFLINE=1, read at import by huggingface_hub), restored afterwards, and
    transformers 4's own copy of the flag (``_is_offline_mode``) on the module transformers 5 no longer keeps it in."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(transformers.utils.hub, "_is_offline_mode", True, raising=False)
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    return monkeypatch


def test_on_colab_the_first_cell_allows_downloads_for_this_kernel(offline, capsys):
    offline.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    assert on_colab() and allow_hub_downloads()
    assert "downloads from the Hugging Face Hub allowed" in capsys.readouterr().out
    assert downloads_allowed()  # what course_model and the speculative pair read
    assert huggingface_hub.constants.HF_HUB_OFFLINE is False and not huggingface_hub.is_offline_mode()
    assert transformers.utils.hub._is_offline_mode is False
    assert not transformers.utils.hub.is_offline_mode()  # transformers reads the Hub's flag at call time


def test_elsewhere_hf_hub_offline_keeps_its_meaning(offline, capsys):
    assert not on_colab() and not allow_hub_downloads()
    assert capsys.readouterr().out == ""
    assert huggingface_hub.constants.HF_HUB_OFFLINE is True and transformers.utils.hub._is_offline_mode is True
    assert not downloads_allowed()
    offline.delenv("HF_HUB_OFFLINE")
    assert not allow_hub_downloads() and "HF_HUB_OFFLINE" not in os.environ  # unset stays unset
