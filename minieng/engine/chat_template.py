"""Chat prompts: a conversation through the model's chat template, tokenized once.

A chat template renders messages to text that already holds the model's special tokens (Llama 3's
begins with ``<|begin_of_text|>``, its BOS). Rendering to text and then encoding that text with
special tokens added puts a second BOS in front: ``[bos, bos, ...]``, a prompt the model never saw
in training. So the template is applied with ``tokenize=True``: the template alone decides the
special tokens, and the engine receives token ids, which it never tokenizes again.
"""

from __future__ import annotations

from minieng.core.outputs import EMPTY_PROMPT, check_text

Message = dict[str, str]  # {"role": "user", "content": "..."}


def chat_token_ids(tokenizer, messages: str | list[Message]) -> list[int]:
    """Token ids of ``messages`` through ``tokenizer``'s chat template, the generation prompt added.

    Args:
        tokenizer: a transformers tokenizer with a ``chat_template``.
        messages: ``[{"role": ..., "content": ...}, ...]``, or a str: one user message.
    Raises:
        ValueError: no tokenizer or no chat template (send a plain prompt instead), a user
            message with no text (almost surely a mistake: the template would wrap it all the same),
            or a message whose text is not valid Unicode (``check_text``).
    """
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise ValueError("this model has no chat template: send the prompt as plain text or token ids")
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    for i, m in enumerate(messages):
        if m.get("role") == "user" and not str(m.get("content", "")).strip():
            raise ValueError(EMPTY_PROMPT)
        if isinstance(m.get("content"), str):
            check_text(m["content"], f"message {i}'s content")
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    if ids and isinstance(ids[0], list):  # some tokenizers answer a batch of one
        ids = ids[0]
    return list(ids)
