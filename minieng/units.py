"""Two pieces of arithmetic every layer uses: a GiB in bytes, and division rounded up. A leaf."""

GIB = 1024**3  # bytes


def cdiv(a: int, b: int) -> int:
    """a / b rounded up, for non-negative integers (blocks that hold ``a`` tokens of ``b`` each)."""
    return -(-a // b)
