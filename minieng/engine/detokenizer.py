"""Incremental detokenization for streaming, and stop strings.

A byte-level BPE token can hold half of a UTF-8 character: decoding it alone gives U+FFFD.
The detokenizer therefore decodes a short window of recent tokens and only releases text once
the window no longer ends in a replacement character (the prefix/read offsets of Hugging Face's
``TextStreamer`` and vLLM). Text that could still become the start of a stop string is held
back, so a stop string never leaks into the stream. The concatenation of all deltas equals
``output_text``, which equals the decode of all output ids unless a stop string cut it.
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer, stop: list[str] | None = None, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.stop = list(stop or [])
        self.skip_special_tokens = skip_special_tokens
        self.token_ids: list[int] = []
        self.text = ""  # decoded so far (may extend past a stop string before truncation)
        self.output_text = ""  # final text, cut at a stop string
        self.num_released = 0  # characters of text already handed out as deltas
        self.prefix_offset = 0
        self.read_offset = 0
        self.stopped = False

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add(self, new_token_ids: list[int]) -> str:
        """Feed new output ids; return the text delta now safe to show (maybe "")."""
        self.token_ids.extend(new_token_ids)
        prefix = self._decode(self.token_ids[self.prefix_offset : self.read_offset])
        window = self._decode(self.token_ids[self.prefix_offset :])
        if len(window) > len(prefix) and not window.endswith(REPLACEMENT):
            self.text += window[len(prefix) :]
            self.prefix_offset, self.read_offset = self.read_offset, len(self.token_ids)
        return self._release(final=False)

    def _release(self, final: bool) -> str:
        end = len(self.text)
        for s in self.stop:
            hit = self.text.find(s)
            if hit != -1 and hit < end:
                end, self.stopped = hit, True
        if not self.stopped and not final:
            end -= self._held_back()
        self.output_text = self.text[:end] if (self.stopped or final) else self.text
        if end <= self.num_released:
            return ""
        delta = self.text[self.num_released : end]
        self.num_released = end
        return delta

    def _held_back(self) -> int:
        """Characters at the end of the text that could be the beginning of a stop string."""
        longest = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(self.text)), longest, -1):
                if self.text.endswith(s[:k]):
                    longest = k
                    break
        return longest

    def finish(self) -> str:
        """Flush what is left when the request ends (a trailing partial character included)."""
        if not self.stopped:
            full = self._decode(self.token_ids)
            if full.startswith(self.text):
                self.text = full
        return self._release(final=True)
