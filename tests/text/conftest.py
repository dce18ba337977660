"""Shared fixtures of the text tests: the shipped SmolLM2 GGUF, our tokenizer of it and
transformers' tokenizer of the same file (the independent reference), each built once a session.

The reference is ``AutoTokenizer.from_pretrained(dir, gguf_file=name)``, which is how vLLM loads a
GGUF's tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest
from text_cases import reference_tokenizer

from mrv2_prof.runner.model.shipped import shipped_path


@pytest.fixture(scope="session")
def smollm_gguf() -> Path:
    path = shipped_path("smollm2-135m")
    if path is None:
        pytest.skip("the shipped smollm2-135m GGUF is not on this machine")
    return path


@pytest.fixture(scope="session")
def ours(smollm_gguf):
    from mrv2_prof.text import load_tokenizer

    return load_tokenizer(smollm_gguf)


@pytest.fixture(scope="session")
def reference(smollm_gguf):
    return reference_tokenizer(smollm_gguf)
