"""A run's text: the model's tokenizer and chat template (no torch; the runner only inside
``tokenizer_for``). architecture: "Folders and who may import whom"."""

from mrv2_prof.text.errors import TokenizerError
from mrv2_prof.text.text_tokenizer import TextTokenizer
from mrv2_prof.text.tokenizer_loader import load_tokenizer, tokenizer_for

__all__ = ["TextTokenizer", "TokenizerError", "load_tokenizer", "tokenizer_for"]
