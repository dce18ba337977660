"""The requests' text columns, decoded on the writer thread (``request_texts.RequestTexts``):
through the harness's hand-over path flush by flush, and in real runs of the harness.

The fake tokenizer spells id i >= 1 as a letter (1 -> a, 2 -> b, ...) and id 0 as the special
token "<s>", which only a decode keeping special tokens shows; every expected text below is
spelled out by hand from the ids.
"""

from __future__ import annotations

import duckdb

from mrv2_prof.pipeline.probe_results import arrow_tables
from mrv2_prof.pipeline.request_rows import InFlightRows
from mrv2_prof.pipeline.request_texts import RequestTexts
from mrv2_prof.probes.recording import RecordingProbe
from mrv2_prof.runner.engine import Engine
from mrv2_prof.store import Store

RUN = "abc123"


class LetterTokenizer:
    def __init__(self, fail_on: int | None = None) -> None:
        self.fail_on = fail_on

    def decode_batch(self, ids: list[list[int]], skip_special_tokens: bool = True) -> list[str]:
        out = []
        for seq in ids:
            if self.fail_on in seq:
                raise ValueError(f"id {self.fail_on} is not in the vocabulary")
            out.append(
                "".join(
                    ("" if skip_special_tokens else "<s>") if i == 0 else chr(96 + (i - 1) % 26 + 1)
                    for i in seq
                )
            )
        return out


def _spell(ids, skip: bool) -> str:
    """The fake tokenizer's rule, for the runs whose ids the test does not choose."""
    return LetterTokenizer().decode_batch([list(ids)], skip)[0]


class Writer:
    """The harness's flush and ``convert`` in one thread: swap, decode, follow, add, append."""

    def __init__(self, store: Store, probe: RecordingProbe, texts: RequestTexts) -> None:
        self.store, self.probe, self.texts, self.rows = store, probe, texts, InFlightRows()

    def flush(self) -> None:
        handoff = self.probe.swap()
        batches = self.probe.decode(handoff)
        self.rows.add_to(batches, self.rows.follow(handoff, self.probe.name_of))
        self.texts.add_to(batches)
        self.store.append_batches(RUN, arrow_tables(batches))
        self.probe.give_back(handoff)


def _begin(store: Store) -> None:
    store.begin_run(
        RUN, scenario_name="s", label="s", matrix_combo=None, scenario_yaml="", device="cpu",
        versions={}, started_ns=1,
    )  # fmt: skip


def _texts(store: Store) -> list[tuple]:
    return store.connection.execute(
        "SELECT req_id, finish_reason, prompt_text, output_text FROM requests ORDER BY req_id"
    ).fetchall()


def test_texts_are_decoded_flush_by_flush_and_an_unfinished_request_keeps_null_output(tmp_path):
    prompts = {"a": (0, 1, 2, 3), "b": (0, 26, 27), "c": (5,)}
    probe = RecordingProbe()
    with Store.open(tmp_path / "runs.duckdb") as store:
        _begin(store)
        writer = Writer(store, probe, RequestTexts(LetterTokenizer(), prompts))
        probe.request_arrival("a", 100, 4)
        probe.request_arrival("b", 200, 3)
        probe.token("a", 0, 150, 4)
        probe.token("a", 1, 160, 5)
        writer.flush()
        assert _texts(store) == [
            ("a", None, "<s>abc", None),  # in flight: its prompt, no output yet
            ("b", None, "<s>za", None),  # ids wrap around the alphabet: 26 -> z, 27 -> a
        ]
        probe.token("a", 2, 170, 8)
        probe.token("a", 3, 175, 0)  # the EOS-like special token: skipped in the output
        probe.request_finish("a", 180, 4, 0, "stop", 0)
        probe.token("b", 0, 210, 9)
        probe.request_arrival("c", 300, 1)
        probe.request_finish("c", 305, 0, 0, "abort", 0)  # aborted at arrival: no token
        writer.flush()
        assert _texts(store) == [
            ("a", "stop", "<s>abc", "deh"),  # tokens of both flushes, in output order
            ("b", None, "<s>za", None),
            ("c", "abort", "e", ""),  # finished with nothing: an empty output, not NULL
        ]
        probe.token("b", 1, 220, 10)
        # the run stops: the harness closes what is still in flight without a finish
        probe.request_finish("b", -1, 2, 0, None, 0)
        writer.flush()
        assert _texts(store) == [
            ("a", "stop", "<s>abc", "deh"),
            ("b", None, "<s>za", None),  # never finished: the prompt, but no output text
            ("c", "abort", "e", ""),
        ]
        assert writer.texts.note() is None


def test_tokens_of_one_flush_out_of_order_are_put_in_output_order(tmp_path):
    probe = RecordingProbe()
    with Store.open(tmp_path / "runs.duckdb") as store:
        _begin(store)
        writer = Writer(store, probe, RequestTexts(LetterTokenizer(), {"a": (1,)}))
        probe.request_arrival("a", 100, 1)
        probe.token("a", 1, 160, 2)
        probe.token("a", 0, 150, 3)
        probe.request_finish("a", 180, 2, 0, "length", 0)
        writer.flush()
        assert _texts(store) == [("a", "length", "a", "cb")]


def test_a_text_that_cannot_be_decoded_is_null_and_a_note_says_so(tmp_path):
    prompts = {"a": (1, 2), "b": (3, 99)}  # b's prompt holds the id the tokenizer refuses
    probe = RecordingProbe()
    with Store.open(tmp_path / "runs.duckdb") as store:
        _begin(store)
        texts = RequestTexts(LetterTokenizer(fail_on=99), prompts)
        writer = Writer(store, probe, texts)
        for name, t in (("a", 100), ("b", 200)):
            probe.request_arrival(name, t, 2)
            probe.token(name, 0, t + 10, 4)
            probe.request_finish(name, t + 20, 1, 0, "length", 0)
        writer.flush()
        assert _texts(store) == [("a", "length", "ab", "d"), ("b", "length", None, "d")]
        assert texts.note() == (
            "request texts: 1 prompt or output text(s) could not be decoded and are NULL "
            "(first error: id 99 is not in the vocabulary)"
        )


def test_a_run_without_a_tokenizer_has_no_decoder():
    assert RequestTexts.of(None, []) is None


def _capture_prompts(monkeypatch) -> dict[str, tuple[int, ...]]:
    """Make every run decode with the fake tokenizer; returns the prompts it was given."""
    prompts: dict[str, tuple[int, ...]] = {}

    def of(cls, tokenizer, requests):  # the quickstart's model has none: the fake stands in
        requests = list(requests)
        prompts.update((w.req_id, w.prompt_token_ids) for w in requests)
        return cls(LetterTokenizer(), dict(prompts))

    monkeypatch.setattr(RequestTexts, "of", classmethod(of))
    return prompts


def _stored(db_path: str) -> tuple[list[tuple], dict[str, list[int]]]:
    with duckdb.connect(db_path, read_only=True) as con:
        rows = con.execute(
            "SELECT req_id, finish_reason, prompt_text, output_text FROM requests ORDER BY req_id"
        ).fetchall()
        tokens: dict[str, list[int]] = {}
        query = "SELECT req_id, token_id FROM tokens ORDER BY req_id, idx"
        for req, token in con.execute(query).fetchall():
            tokens.setdefault(req, []).append(token)
    return rows, tokens


def test_a_run_stores_each_requests_prompt_and_output_text(run_in_process, monkeypatch):
    prompts = _capture_prompts(monkeypatch)
    job, _ = run_in_process("workload.num_requests=4", "workload.output_len.value=6")
    rows, tokens = _stored(job.db_path)
    assert len(rows) == 4 and set(prompts) == {r[0] for r in rows}
    for req, reason, prompt_text, output_text in rows:
        assert reason == "length" and len(tokens[req]) == 6
        assert prompt_text == _spell(prompts[req], skip=False)
        assert output_text == _spell(tokens[req], skip=True)


def test_a_run_that_fails_keeps_prompt_texts_and_no_output_text(run_in_process, monkeypatch):
    prompts = _capture_prompts(monkeypatch)
    original = Engine.step

    def failing_step(self):
        if self.step_index == 3:
            raise RuntimeError("injected failure in step 3")
        return original(self)

    monkeypatch.setattr(Engine, "step", failing_step)
    job, sent = run_in_process("workload.num_requests=4")
    assert sent[-1][1].status == "failed"
    rows, tokens = _stored(job.db_path)
    assert len(rows) == 4 and all(len(t) == 3 for t in tokens.values())  # steps 0-2 ran
    for req, reason, prompt_text, output_text in rows:
        assert reason is None and output_text is None
        assert prompt_text == _spell(prompts[req], skip=False)
