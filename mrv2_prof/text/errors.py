"""The one error of the text package: a tokenizer or chat template that cannot be used.

Its message is one line naming the file (and the key, where there is one) and what is wrong, so
the CLI can print it as it is (architecture: "Bad input")."""

from __future__ import annotations


class TokenizerError(ValueError):
    """A tokenizer file, its metadata or its chat template is unusable (one line, naming the
    file)."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))
