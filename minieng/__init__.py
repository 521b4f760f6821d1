"""minieng: a compact LLM inference engine, and the instruments to measure it.

Nothing is loaded or probed at import; ``LLMEngine()`` loads the embedded default model.
"""

from minieng._version import __version__
from minieng.config import EngineConfig, ModelConfig, SamplingParams
from minieng.engine.llm_engine import LLMEngine
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
