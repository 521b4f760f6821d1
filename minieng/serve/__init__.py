"""Serving: the OpenAI-compatible HTTP server, its protocol, and a load generator for any such server."""

from minieng.serve.loadgen import load_requests, run_load, served_models
from minieng.serve.server import ServerThread, build_app, served_model_name

__all__ = [
    "build_app",
    "load_requests",
    "run_load",
    "served_model_name",
    "served_models",
    "ServerThread",
]
