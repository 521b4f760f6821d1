"""Serving: the OpenAI-compatible HTTP server, its protocol, and a load generator for any such server."""

from minieng.measure.loadgen import load_requests, run_load, served_models  # the client side, re-exported
from minieng.serve.server import ServerThread, build_app, served_model_name

__all__ = [
    "build_app",
    "load_requests",
    "run_load",
    "served_model_name",
    "served_models",
    "ServerThread",
]
