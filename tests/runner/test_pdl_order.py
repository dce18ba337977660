"""``pdl.py``'s rules on every kernel that takes ``USE_GDC``, checked on its sm_90 code.

``python -m tests.runner.pdl_rules`` (one process, without the interpreter) calls each kernel's
host wrapper as the decoder calls it, with PDL on and off, compiles each launch for sm_90 on the
CPU and reports what the rule checker found. With PDL the kernel's reads of the previous
kernel's outputs (activations, the KV cache, split partials) and all its writes must follow a
wait; with PDL off the code has no grid-dependency op at all (the default path is unchanged).
The checker itself is shown to catch a kernel that reads its input first.
"""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from tests.runner.pdl_rules import CASES, run_without_interpreter  # noqa: E402


@pytest.fixture(scope="module")
def report() -> dict:
    return run_without_interpreter("tests.runner.pdl_rules")


@pytest.mark.parametrize("case", sorted(CASES))
def test_pdl_kernels_wait_before_reading_what_the_kernel_before_writes(case, report):
    launches = report[f"{case}:on"]
    assert launches, "the wrapper launched nothing"
    for k in launches:
        assert k["use_gdc"] is True and k["launch_pdl"] is True, k
        assert k["waits"] >= 1 and k["launches_dependents"] >= 1, k
        assert k["dependent"], f"{k['kernel']}: no dependent parameter"
        assert k["breaks"] == [], k


@pytest.mark.parametrize("case", sorted(CASES))
def test_without_pdl_the_kernels_have_no_grid_dependency_ops(case, report):
    """The default launch has no wait, so the checker, given the same parameters, reports every
    one of them read or written unwaited: the PDL test above is not passing vacuously."""
    for k in report[f"{case}:off"]:
        assert k["use_gdc"] is False and k["launch_pdl"] is False, k
        assert k["waits"] == 0 and k["launches_dependents"] == 0, k
        text = " ".join(b.split(":")[0] for b in k["breaks"])
        assert [p for p in k["dependent"] if f"'{p}'" not in text] == [], k["breaks"]


def test_the_checker_names_each_broken_rule(report):
    """The rule-breaking kernel: its input read and its early write before the wait (rule 1) and
    its last store, covered only by waits inside a loop (rule 3), are each reported; the
    weight's load is not."""
    (k,) = report["reads_first"]
    assert [b.split(":")[0] for b in k["breaks"]] == [
        "load of ['x_ptr'] before a wait",
        "write to ['out_ptr'] before a wait",
        "write to ['out_ptr'] before a wait",
    ]


@pytest.mark.parametrize("case", sorted(c for c in CASES if c.startswith("gemv")))
def test_only_the_pipelined_gemv_walk_copies_asynchronously(case, report):
    """The ``loop_stages`` cases are software-pipelined (their tiles copied into shared memory
    ahead of use), with PDL on and off; the GEMV's default walk is not (its loads are plain, so
    its waits above are checked on the loads themselves)."""
    for side in ("on", "off"):
        (k,) = report[f"{case}:{side}"]
        assert (k["async_copies"] > 0) == case.endswith("_pipelined"), (case, side, k)
