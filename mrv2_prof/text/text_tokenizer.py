"""``TextTokenizer``: a run's tokenizer, as vLLM uses it: prompts encoded with the tokenizer's own
special tokens, chat conversations rendered by the model's template and encoded without them,
and token ids decoded back to text.

It wraps a ``tokenizers.Tokenizer`` (built from a checkpoint's ``tokenizer.json`` or from a GGUF's
metadata) and the model's ``ChatTemplate``; batches go through the library's parallel batch
encode."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mrv2_prof.text.errors import TokenizerError

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from mrv2_prof.text.chat_template import ChatTemplate


class TextTokenizer:
    """A loaded tokenizer and chat template; ``source`` is the file they came from."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        source: str,
        eos_token_ids: tuple[int, ...],
        bos_token_id: int | None,
        chat_template: ChatTemplate | None,
        clean_up_spaces: bool = False,
    ) -> None:
        self.source = source
        self.vocab_size: int = tokenizer.get_vocab_size(with_added_tokens=True)
        self.eos_token_ids = tuple(eos_token_ids)
        self.bos_token_id = bos_token_id
        self.has_chat_template = chat_template is not None
        self.backend = tokenizer
        self._chat_template = chat_template
        self._clean_up_spaces = clean_up_spaces

    def __repr__(self) -> str:
        return f"TextTokenizer({self.source!r}, vocab_size={self.vocab_size})"

    @property
    def chat_template(self) -> str | None:
        """The template's source text, or None."""
        return self._chat_template.text if self._chat_template is not None else None

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Each prompt as vLLM tokenizes it: the tokenizer's call with its special tokens (a BOS
        where the tokenizer adds one)."""
        return self._encode(texts, add_special_tokens=True)

    def encode_chat_batch(self, conversations: list[list[dict[str, str]]]) -> list[list[int]]:
        """Each conversation rendered with ``add_generation_prompt=True`` and encoded without
        special tokens (the template writes them), as transformers' ``apply_chat_template``."""
        return self._encode(
            [self.render_chat(messages) for messages in conversations], add_special_tokens=False
        )

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        """The conversation as prompt text, ending with the assistant's turn opened."""
        if self._chat_template is None:
            raise TokenizerError(f"{self.source}: the tokenizer has no chat_template")
        return self._chat_template.render(messages, add_generation_prompt=True)

    def decode_batch(self, ids: list[list[int]], skip_special_tokens: bool = True) -> list[str]:
        """Each id sequence as text (special tokens left out unless ``skip_special_tokens`` is
        False)."""
        texts = self.backend.decode_batch(
            [list(row) for row in ids], skip_special_tokens=skip_special_tokens
        )
        if self._clean_up_spaces:
            texts = [_clean_up(text) for text in texts]
        return texts

    def _encode(self, texts: list[str], *, add_special_tokens: bool) -> list[list[int]]:
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise TypeError("encode takes a list of str")
        encodings = self.backend.encode_batch_fast(texts, add_special_tokens=add_special_tokens)
        return [encoding.ids for encoding in encodings]


def _clean_up(text: str) -> str:
    """transformers' ``clean_up_tokenization`` (only for a tokenizer that asks for it and is not
    BPE, as transformers does)."""
    for before, after in (
        (" .", "."),
        (" ?", "?"),
        (" !", "!"),
        (" ,", ","),
        (" ' ", "'"),
        (" n't", "n't"),
        (" 'm", "'m"),
        (" 's", "'s"),
        (" 've", "'ve"),
        (" 're", "'re"),
    ):
        text = text.replace(before, after)
    return text
