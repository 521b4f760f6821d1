"""minieng: a compact LLM inference engine, and the instruments to measure it.

Nothing is loaded or probed at import; ``LLMEngine()`` loads the embedded default model.
"""

from .config import EngineConfig, ModelConfig, SamplingParams
from .engine import LLMEngine
from .outputs import RequestOutput, StepRecord
from .package_data import data_path

__all__ = ["EngineConfig", "LLMEngine", "ModelConfig", "RequestOutput", "SamplingParams", "StepRecord", "data_path"]
__version__ = "0.1.0"
