"""Speculative decoding: drafters (``drafters``: a draft model, or prompt lookup), verification
(``verification``), and the ``Speculator`` that attaches them to an engine's two seams.
"""
