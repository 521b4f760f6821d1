"""Request inputs for experiments: prompts of an exact token length cut from real text.

The text is public-domain prose shipped in the repository's ``data/text/`` (Jane Austen's
*Pride and Prejudice*, chapters 1-11; see its README). Real text rather than random ids: the
attention patterns and the tokens generated look like a real workload's.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
DEFAULT_TEXT = DATA_DIR / "text" / "pride_and_prejudice.txt"


@lru_cache(maxsize=4)
def _text_token_ids(tokenizer, path: Path) -> tuple[int, ...]:
    if not path.is_file():
        raise ValueError(f"{path} not found: run from a clone of the minieng repository "
                         "(the text corpus lives in its data/ folder)")
    return tuple(tokenizer.encode(path.read_text(encoding="utf-8"), add_special_tokens=False))


def text_prompts(tokenizer, num_tokens: int, count: int = 1, path: Path = DEFAULT_TEXT) -> list[list[int]]:
    """``count`` distinct prompts of exactly ``num_tokens`` token ids, cut from real text.

    Consecutive prompts start at different places of the text (they share no prefix), wrapping
    around when the text is shorter than ``num_tokens * count``.
    Raises ``ValueError`` if the text is shorter than one prompt.
    """
    ids = _text_token_ids(tokenizer, path)
    if num_tokens > len(ids):
        raise ValueError(f"num_tokens={num_tokens} exceeds the {len(ids)} tokens of {path.name}")
    stride = max(1, (len(ids) - num_tokens) // max(1, count))
    return [list(ids[(i * stride) % (len(ids) - num_tokens + 1):][:num_tokens]) for i in range(count)]
