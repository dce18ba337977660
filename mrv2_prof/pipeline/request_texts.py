"""The ``requests`` rows' text columns, decoded on the writer thread as each flush is written.

Token ids stay the ground truth; ``requests.prompt_text`` and ``output_text`` are derived from
them, off the step loop (architecture: Store contract). ``RequestTexts.add_to`` runs in the
harness's ``convert`` after ``InFlightRows.add_to``, over the decoded hand-over of one flush:
it adds each flushed token to its request's output ids, then fills both columns of every
``requests`` row of the flush. The prompt text (special tokens kept: what the model saw, chat
template included) is decoded from the workload's prompt ids once, for the request's first row,
and written again with each later row (a row replaces the one before); the output text (special
tokens skipped, as vLLM) when the finished row is written (``finish_reason`` set). A request
that never finished (the run stopped) keeps a NULL output text. A run whose model has no
tokenizer gets no ``RequestTexts``: both columns stay NULL.

A decoding error never fails the run: that text is NULL and ``note`` says how many were lost.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    from mrv2_prof.workload import WorkloadRequest

Batches = dict[str, dict[str, np.ndarray]]


class Decoder(Protocol):
    """What decoding needs of a tokenizer (``mrv2_prof.text.TextTokenizer``)."""

    def decode_batch(self, ids: list[list[int]], skip_special_tokens: bool = True) -> list[str]: ...


class RequestTexts:
    """Per run, on the writer thread: the prompt ids of every request of the workload, and the
    prompt text and output ids so far of each request not yet finished."""

    def __init__(self, tokenizer: Decoder, prompts: Mapping[str, Sequence[int]]) -> None:
        self._tokenizer = tokenizer
        self._prompts = prompts
        self._prompt_text: dict[str, str | None] = {}
        self._output_ids: dict[str, list[int]] = {}
        self.num_failed = 0
        self.first_error: str | None = None

    @classmethod
    def of(
        cls, tokenizer: Decoder | None, requests: Iterable[WorkloadRequest]
    ) -> RequestTexts | None:
        """The run's decoder over ``requests``' prompt ids; None without a tokenizer."""
        if tokenizer is None:
            return None
        return cls(tokenizer, {w.req_id: w.prompt_token_ids for w in requests})

    def add_to(self, batches: Batches) -> None:
        """Follow ``batches["tokens"]`` and fill ``prompt_text`` and ``output_text`` of every
        row of ``batches["requests"]`` (one flush, decoded)."""
        tokens = batches.get("tokens")
        if tokens is not None and len(tokens["req_id"]):
            self._follow(tokens)
        rows = batches.get("requests")
        if rows is None:
            return
        names = [str(n) for n in rows["req_id"].tolist()]
        finished = [r is not None for r in rows["finish_reason"].tolist()]
        self._decode_prompts([n for n in names if n not in self._prompt_text])
        prompts = [self._prompt_text.get(n) for n in names]
        done = [n for n, f in zip(names, finished, strict=True) if f]
        texts = self._decode([self._output_ids.get(n, []) for n in done], True)
        outputs = dict(zip(done, texts, strict=True))
        rows["prompt_text"] = np.array(prompts, dtype=object)
        rows["output_text"] = np.array(
            [outputs[n] if f else None for n, f in zip(names, finished, strict=True)], dtype=object
        )
        for name in done:  # a finished request is written no more: forget it
            self._prompt_text.pop(name, None)
            self._output_ids.pop(name, None)

    def note(self) -> str | None:
        """A note for the run when texts were lost to decoding errors."""
        if not self.num_failed:
            return None
        return (
            f"request texts: {self.num_failed} prompt or output text(s) could not be decoded "
            f"and are NULL (first error: {self.first_error})"
        )

    def _follow(self, tokens: Mapping[str, np.ndarray]) -> None:
        """Each request's token ids of this flush, in output order, after its earlier ones."""
        names = tokens["req_id"].astype(str)
        order = np.lexsort((tokens["idx"], names))
        names, ids = names[order], tokens["token_id"][order]
        unique, starts = np.unique(names, return_index=True)
        ends = [*starts[1:].tolist(), len(names)]
        for name, start, end in zip(unique.tolist(), starts.tolist(), ends, strict=True):
            self._output_ids.setdefault(name, []).extend(ids[start:end].tolist())

    def _decode_prompts(self, names: list[str]) -> None:
        known = [n for n in dict.fromkeys(names) if n in self._prompts]
        texts = self._decode([list(self._prompts[n]) for n in known], False)
        self._prompt_text.update(zip(known, texts, strict=True))
        self._prompt_text.update((n, None) for n in names if n not in self._prompts)

    def _decode(self, ids: list[list[int]], skip_special: bool) -> list[str | None]:
        """Texts of ``ids``, one call for all; after an error each alone (a bad one is None)."""
        if not ids:
            return []
        try:
            return list(self._tokenizer.decode_batch(ids, skip_special_tokens=skip_special))
        except Exception:
            out: list[str | None] = []
            for one in ids:
                try:
                    out.append(self._tokenizer.decode_batch([one], skip_special)[0])
                except Exception as exc:
                    self.num_failed += 1
                    if self.first_error is None:
                        self.first_error = " ".join(str(exc).split())[:200] or type(exc).__name__
                    out.append(None)
            return out
