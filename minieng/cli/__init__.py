"""The command line: ``python -m minieng {generate, bench, serve, loadgen, notebooks, course}`` (``main``)."""
