"""The ``repeat`` prompt set of benchmarks/spec_decode.py: chat prompts whose answer repeats the
prompt, so that an n-gram drafter (prompt lookup) finds the right drafts.

The texts are the human turns of the shipped dataset ``scenarios/data/mixed_tasks.json``
(ShareGPT format) of ``MIN_CHARS``-``MAX_CHARS`` characters, each once (first occurrence), in
an order shuffled with ``SEED``. Each becomes one user message, ``INSTRUCTION`` followed by the
text, rendered with the model's chat template (the generation prompt opened) and encoded by the
project's tokenizer (``mrv2_prof.text.tokenizer_for``), as a chat request is.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from mrv2_prof.runner.config import ModelSpec
from mrv2_prof.text import tokenizer_for

DATASET = Path(__file__).resolve().parent.parent / "scenarios" / "data" / "mixed_tasks.json"
INSTRUCTION = "Repeat the following text exactly, word for word:\n\n"
MIN_CHARS, MAX_CHARS = 200, 1200
SEED = 0


def repeat_texts(path: Path = DATASET, seed: int = SEED) -> list[str]:
    """The dataset's human turns of MIN_CHARS to MAX_CHARS characters, each once, shuffled."""
    with open(path) as f:
        records = json.load(f)
    texts: dict[str, None] = {}  # insertion-ordered set
    for record in records:
        for turn in record["conversations"]:
            text = turn["value"]
            if turn["from"] == "human" and MIN_CHARS <= len(text) <= MAX_CHARS:
                texts.setdefault(text)
    out = list(texts)
    random.Random(seed).shuffle(out)
    return out


def repeat_prompts(spec: ModelSpec, path: Path = DATASET) -> list[list[int]]:
    """The token ids of every prompt of the set for the model ``spec`` (which needs a tokenizer
    with a chat template: a shipped real model)."""
    tokenizer = tokenizer_for(spec)
    if tokenizer is None or not tokenizer.has_chat_template:
        raise SystemExit(
            f"spec_decode: --workload repeat needs a model with a tokenizer and a chat template; "
            f"preset {spec.preset} has random weights and none (use --preset smollm2-135m, or "
            f"--workload random)"
        )
    chats = [[{"role": "user", "content": INSTRUCTION + text}] for text in repeat_texts(path)]
    return tokenizer.encode_chat_batch(chats)
