"""Quantization as a swap of a built model's linear layers (``quantization``): the integer codes
(``quant_codes``) and the kernels that multiply them (``quant_kernels``).
"""
