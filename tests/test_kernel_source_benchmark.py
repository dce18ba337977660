"""``benchmarks/kernel_source.py`` reads Nsight Compute's source page: each source line's
samples and stall reasons summed over the launches' blocks, instruction rows and "Not Issued"
columns left out, lines ranked by samples (a page worked by hand; the GPU run is the
benchmark's own)."""

from __future__ import annotations

import pytest

from tests.benchmark_runs import load_benchmark, run_benchmark

HEAD = ["Line No", "Source", "Address", "Source", "Warp Stall Sampling (All Samples)",
        "Warp Stall Sampling (Not-issued Samples)", "stall_long_sb", "stall_barrier",
        "stall_long_sb (Not Issued)"]  # fmt: skip


def block(path: str, lines: list[tuple[str, str, str, str, str]]) -> list[list[str]]:
    """A file's block of one launch: (line, source, samples, long_sb, barrier) per line, each
    followed by one instruction row (its number empty, its samples not counted again)."""
    rows = [["File Path", path], ["Function Name", "_attend"], HEAD]
    for no, src, samples, long_sb, barrier in lines:
        rows.append([no, src, "-", "-", samples, samples, long_sb, barrier, "99"])
        rows.append(["", "", "0x7f00", "  LDG.E R1, [R2]", samples, "0", long_sb, barrier, "99"])
    return rows


def page() -> str:
    launch_1 = [*block("/x/attn.py", [("77", "k = tl.load(k)", "10", "8", "0"),
                                      ("86", "acc = tl.dot(p, v)", "2", "0", "0")]),
                *block("/y/standard.py", [("191", "return reduce(x)", "3", "0", "3")])]  # fmt: skip
    launch_2 = [*block("/x/attn.py", [("77", "k = tl.load(k)", "1,000", "900", "0"),
                                      ("90", "tl.store(o)", "-", "-", "-")])]  # fmt: skip
    return "\n".join(",".join(f'"{c}"' for c in r) for r in [*launch_1, *launch_2]) + "\n"


def test_the_lines_are_summed_over_the_launches_and_ranked(monkeypatch):
    ks = load_benchmark("kernel_source", monkeypatch)
    lines = ks.parse_source(page())
    got = [(c["file"], c["line"], c["samples"]) for c in lines]
    # line 77: 10 + 1,000 over two launches; a "-" is no sample
    assert got == [("attn.py", 77, 1010.0), ("standard.py", 191, 3.0), ("attn.py", 86, 2.0),
                   ("attn.py", 90, 0.0)]  # fmt: skip
    assert lines[0]["stalls"] == {"long_sb": 908.0}  # not the "(Not Issued)" column's 99s
    assert lines[1]["stalls"] == {"barrier": 3.0} and lines[2]["stalls"] == {}
    assert lines[0]["source"] == "k = tl.load(k)"
    table = ks.markdown(lines, top=2)
    assert table.splitlines()[0] == "1015 samples over 4 source lines"
    assert "| attn.py:77 | 99.5 % | 1010 | long_sb 908 | `k = tl.load(k)` |" in table
    assert "attn.py:86" not in table  # beyond --top


def test_not_a_source_page_is_refused(monkeypatch):
    ks = load_benchmark("kernel_source", monkeypatch)
    with pytest.raises(ValueError, match="not an ncu source page"):
        ks.parse_source('"ID","Kernel Name"\n"0","_attend"\n')


def test_summarize_a_saved_page_through_the_command(tmp_path):
    saved = tmp_path / "page.csv"
    saved.write_text(page())
    run = run_benchmark("kernel_source.py", tmp_path / "out.json", "--summarize", str(saved),
                        timeout=120)  # fmt: skip
    assert "| standard.py:191 | 0.3 % | 3 | barrier 3 | `return reduce(x)` |" in run.stdout
    assert [c["line"] for c in run.results] == [77, 191, 86, 90]
    assert "By the function that holds the line:" in run.stdout
    groups = run.data["meta"]["by_function"]  # the groups hold every sample
    assert sum(g["samples"] for g in groups) == 1015.0


def test_a_missing_saved_page_is_one_line(tmp_path):
    import subprocess
    import sys

    from tests.benchmark_runs import BENCHMARKS

    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / "kernel_source.py"), "--summarize",
         str(tmp_path / "none.csv")], capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": str(BENCHMARKS.parent), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines() == [
        f"kernel_source: --summarize {tmp_path / 'none.csv'}: no such file"
    ]


def test_a_line_is_counted_to_the_innermost_function_that_holds_it(monkeypatch):
    ks = load_benchmark("kernel_source", monkeypatch)
    src = "x = 1\n\ndef outer():\n    a = 1\n    def inner():\n        b = 2\n    c = 3\n"
    assert ks.enclosing_functions(src) == {3: "outer", 4: "outer", 5: "inner", 6: "inner",
                                           7: "outer"}  # fmt: skip


def test_the_samples_by_function_find_each_file_and_check_its_line(monkeypatch, tmp_path):
    """``attn.py`` (under a source root): its line 77 in ``walk``, 90 in ``kernel``; line 86 is
    other text there now (the source changed); ``standard.py`` is nowhere. Shares of the 1,015
    samples, worked by hand."""
    ks = load_benchmark("kernel_source", monkeypatch)
    rows = ["x = 0"] * 69 + ["def walk():"] + ["    pass"] * 18
    rows += ["def kernel():"] + ["    pass"] * 11
    rows[76], rows[85], rows[89] = "    k = tl.load(k)", "    acc = acc + 1", "    tl.store(o)"
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "attn.py").write_text("\n".join(rows) + "\n")
    groups = ks.by_function(ks.parse_source(page()), roots=[tmp_path])
    got = [(g["file"], g["function"], g["samples"], g["lines"]) for g in groups]
    assert got == [
        ("attn.py", "walk", 1010.0, 1),
        ("standard.py", "(source not found)", 3.0, 1),
        ("attn.py", "(source changed)", 2.0, 1),
        ("attn.py", "kernel", 0.0, 1),
    ]
    assert groups[0]["share"] == pytest.approx(1010 / 1015)
    table = ks.function_markdown(groups)
    assert "| walk | attn.py | 99.5 % | 1010 | 1 |" in table


def test_a_quote_mangled_line_still_matches_its_file(monkeypatch):
    """ncu's CSV leaves a quote inside a line unescaped: the reader's text differs in quotes."""
    ks = load_benchmark("kernel_source", monkeypatch)
    line = '        qk = tl.where(k_pos[None, :] <= q_pos[:, None], qk, float("-inf"))'
    assert ks._same(line, 'qk = tl.where(k_pos[None, :] <= q_pos[:, None], qk, float(-inf"))"')
    assert not ks._same(line, "qk = tl.where(k_pos <= q_pos, qk, 0.0)")
