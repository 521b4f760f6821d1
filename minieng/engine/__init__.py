"""The build: ``LLMEngine`` composes the core (``minieng.core``) and the wings (``minieng.wings``)
from an ``EngineConfig``: the checks before anything loads (``config_checks``), the models
(``model_loading``), the offline entry points (``offline``) and chat prompts (``chat_template``).
"""
