"""minieng: a compact LLM inference engine, and the instruments to measure it.

Nothing is loaded or probed at import; ``LLMEngine()`` loads the embedded default model.
``LLMEngine`` is imported on first use, so that the plain core (``minieng.core``) runs without a wing.
"""

from minieng._version import __version__
from minieng.config import EngineConfig, ModelConfig, SamplingParams
from minieng.core.outputs import Logprob, RequestOutput, StepRecord
from minieng.package_data import data_path

__all__ = [
    "__version__",
    "EngineConfig",
    "LLMEngine",
    "Logprob",
    "ModelConfig",
    "RequestOutput",
    "SamplingParams",
    "StepRecord",
    "data_path",
]


def __getattr__(name: str):
    if name == "LLMEngine":
        from minieng.engine.llm_engine import LLMEngine

        return LLMEngine
    raise AttributeError(f"module 'minieng' has no attribute {name!r}")
