"""minieng's version: one place, read by the package and by pyproject.toml."""

__version__ = "0.1.0"
