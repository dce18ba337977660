"""``spec_decode.py``'s markdown for benchmarks/RESULTS.md: a header naming the run, then one
table per async mode, its rows by batch, then configuration, each row against the ``off`` row of
the same async mode and batch."""

from __future__ import annotations


def ratio(value: float | None, base: float | None) -> str:
    return "-" if value is None or not base else f"{value / base:.2f}x"


def markdown(results: list[dict], meta: dict) -> str:
    """One table per async mode, its rows by batch, then configuration."""
    env = meta["env"]
    versions = f"torch {env['torch']}" + (f", triton {env['triton']}" if "triton" in env else "")
    lines = [
        f"### Speculative decoding ({meta['preset']}, {meta['workload']} workload, "
        f"{env['device']})",
        "",
        f"{env['date']}; {env['device']}; {versions}. Preset {meta['preset']}; workload "
        f"{meta['workload']}: {meta['prompts']}; at most {meta['output_len']} output tokens "
        f"per request, greedy, {meta['eos']}. k: {meta['ks']}. TPOT / off: TPOT over the off "
        "row's (same async mode and batch); steps / off: engine steps per output token over "
        "the off row's (steps for the same tokens); sat-out: requests that sat out a step, "
        "summed over the steps; k-off steps: steps adaptive dynamic k turned off.",
    ]
    for mode in dict.fromkeys(r["async_scheduling"] for r in results):
        rows = [r for r in results if r["async_scheduling"] == mode]
        lines += [
            "",
            f"#### async scheduling {'on' if mode else 'off'}",
            "",
            "| config | batch | TPOT (ms) | TPOT / off | tok/s | out tokens | steps | steps / off "
            "| sat-out | mean acceptance length | k-off steps | draft / step (ms) | replays |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
            "| --- |",
        ]
        for batch in dict.fromkeys(r["batch"] for r in rows):
            of_batch = [r for r in rows if r["batch"] == batch]
            off = next((r for r in of_batch if r["config"] == "off"), None)
            for r in of_batch:
                lines.append(row(r, off))
    return "\n".join(lines) + "\n"


def row(r: dict, off: dict | None) -> str:
    mal = "-" if r["mean_acceptance_length"] is None else f"{r['mean_acceptance_length']:.2f}"
    replays = ", ".join(f"{k} {v}" for k, v in sorted(r["replays"].items())) or "-"
    if r.get("draft_graph_replays"):
        replays += f", draft graph {r['draft_graph_replays']}"
    split = "-"
    if "draft_ms" in r:
        split = f"{r['draft_ms']:.2f} / {r['step_ms']:.2f}"
    tpot = "-" if r["tpot_ms"] is None else f"{r['tpot_ms']:.2f}"
    per_token = r["steps"] / max(r["output_tokens"], 1)
    off_tpot = off_per_token = None
    if off is not None:
        off_tpot, off_per_token = off["tpot_ms"], off["steps"] / max(off["output_tokens"], 1)
    k_off = "-" if r["k_off_steps"] is None else str(r["k_off_steps"])
    return (
        f"| {r['config']} | {r['batch']} | {tpot} | {ratio(r['tpot_ms'], off_tpot)} | "
        f"{r['tok_s']:,.0f} | {r['output_tokens']:,} | {r['steps']:,} | "
        f"{ratio(per_token, off_per_token)} | {r['sat_out']:,} | {mal} | {k_off} | {split} | "
        f"{replays} |"
    )
