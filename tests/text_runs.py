"""A hand-made run whose requests have decoded text, shared by the tests of every view of it.

Run ``TEXT_RUN``: requests ``r00`` .. ``r09`` completed, ``r10`` still in flight when the run
ended. Request i arrives at i ms, gets its first token 10 ms later and finishes ``E2E_MS[i]``
after arriving (100, 200, ..., 1000 ms); each has 3 output tokens, so TPOT = (E2E - 10) / 2.
Its prompt is a ChatML template whose last user message is ``question(i)``, its output
``answer(i)``; both carry markup and HTML that a view must show as text, and ``r09``'s output a
terminal escape. Run ``PLAIN_RUN`` has requests without text (a model without a tokenizer).

Worked out once: the 3 slowest by E2E are r09, r08, r07; the median E2E of the ten completed
is 550 ms, and the five of the rest nearest it are r04, r05 (50 ms off), r03, r06 (150 ms),
r02 (250 ms), shown in E2E order r02 .. r06.
"""

from __future__ import annotations

from mrv2_prof.store import Store

TEXT_RUN, PLAIN_RUN = "txt001", "pln002"
MS = 1_000_000
E2E_MS = [100 * (i + 1) for i in range(10)]
ESCAPE = "\x1b[2J"


def question(i: int) -> str:
    return f"What is <b>{i}</b> [red]squared[/red]?"


def answer(i: int) -> str:
    return f"{i * i} <script>alert({i})</script>" + (ESCAPE if i == 9 else "")


def prompt(i: int) -> str:
    return (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        f"<|im_start|>user\n{question(i)}<|im_end|>\n<|im_start|>assistant\n"
    )


def _begin(store: Store, run_id: str, label: str) -> None:
    store.begin_run(
        run_id, scenario_name=label, label=label, matrix_combo=None,
        scenario_yaml=f"name: {label}\n", device="cpu", versions={}, started_ns=0,
        info={"dtype": "float32"},
    )  # fmt: skip


def add_text_run(store: Store, run_id: str = TEXT_RUN, with_text: bool = True) -> None:
    """The run described above (``with_text`` False: the same requests, texts NULL)."""
    _begin(store, run_id, "chat" if with_text else "random")
    ids = [f"r{i:02d}" for i in range(11)]
    arrival = [i * MS for i in range(11)]
    first = [a + 10 * MS for a in arrival]
    finish = [arrival[i] + E2E_MS[i] * MS for i in range(10)] + [None]
    store.append(run_id, "requests", {
        "req_id": ids,
        "arrival_ns": arrival,
        "first_token_ns": first,
        "finish_ns": finish,
        "prompt_tokens": [20 + i for i in range(11)],
        "output_tokens": [3] * 10 + [2],
        "num_preemptions": [0] * 11,
        "finish_reason": ["length"] * 10 + [None],
        "cached_tokens": [0] * 11,
        "prompt_text": [prompt(i) if with_text else None for i in range(11)],
        "output_text": [answer(i) if with_text else None for i in range(10)] + [None],
    })  # fmt: skip
    times = [
        (ids[i], k, t)
        for i in range(11)
        for k, t in enumerate(
            [first[i], (first[i] + finish[i]) // 2, finish[i]] if i < 10 else first[i : i + 1] * 2
        )
    ]
    store.append(run_id, "tokens", {
        "req_id": [r for r, _, _ in times],
        "idx": [k for _, k, _ in times],
        "t_ns": [t + (k * MS if r == "r10" else 0) for r, k, t in times],
        "token_id": [100 + k for _, k, _ in times],
    })  # fmt: skip
    store.finish_run(run_id, "aborted", ended_ns=2_000 * MS)
