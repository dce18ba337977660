"""How long building a text workload of 10,000 requests takes, tokenization included.

Writes a 10,000-entry ShareGPT file with ``scenarios/data/make_dataset.py`` (seeded: 10,000
distinct prompts and replies) and a 10,000-line JSONL trace of the same prompts (half plain
``prompt``, half chat ``messages``), then times ``build_workload`` on each with the shipped
SmolLM2 tokenizer: the dataset as plain text and as chat (every prompt and reply tokenized, the
length filters, the seeded order), the trace (every line parsed, validated and tokenized). The
tokenizer's load is timed apart. Target: each build <= 10 s on a 2-core CPU.

    python benchmarks/tokenize_dataset.py [--requests 10000] [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_io import write_results

from mrv2_prof.runner.config import ModelSpec
from mrv2_prof.scenario import WorkloadSection
from mrv2_prof.text import tokenizer_for
from mrv2_prof.workload import build_workload

ROOT = Path(__file__).resolve().parents[1]
SMOL = ModelSpec(preset="smollm2-135m")
VOCAB, MAX_MODEL_LEN = 49152, 8192


def _files(directory: Path, n: int) -> tuple[Path, Path]:
    dataset = directory / "sharegpt.json"
    script = ROOT / "scenarios" / "data" / "make_dataset.py"
    subprocess.run(
        [sys.executable, str(script), "--entries", str(n), "--seed", "1", "--out", str(dataset)],
        check=True,
        capture_output=True,
    )
    entries = json.loads(dataset.read_text())
    trace = directory / "trace.jsonl"
    with trace.open("w") as f:
        for i, e in enumerate(entries):
            prompt = e["conversations"][0]["value"]
            line = (
                {"prompt": prompt} if i % 2 else {"messages": [{"role": "user", "content": prompt}]}
            )
            f.write(json.dumps({**line, "max_tokens": 64}) + "\n")
    return dataset, trace


def _time(section: WorkloadSection, tokenizer, repeats: int) -> tuple[float, int, int]:
    best, reqs = float("inf"), []
    for _ in range(repeats):
        t0 = time.perf_counter()
        reqs = build_workload(
            section, seed=0, vocab_size=VOCAB, max_model_len=MAX_MODEL_LEN, source="bench.yaml",
            tokenizer=tokenizer, model=SMOL,
        )  # fmt: skip
        best = min(best, time.perf_counter() - t0)
    return best, len(reqs), sum(len(r.prompt_token_ids) for r in reqs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    n = args.requests
    with tempfile.TemporaryDirectory() as tmp:
        dataset, trace = _files(Path(tmp), n)
        t0 = time.perf_counter()
        tokenizer = tokenizer_for(SMOL)
        load_s = time.perf_counter() - t0
        cases = {
            "dataset (plain)": {"num_requests": n, "dataset": {"path": str(dataset)}},
            "dataset (chat)": {"num_requests": n, "dataset": {"path": str(dataset), "chat": True}},
            "trace (prompt / messages)": {"trace": str(trace)},
        }
        results = [{"case": "tokenizer load", "seconds": round(load_s, 3)}]
        print(f"cpu cores: {os.cpu_count()}  tokenizer load: {load_s:.2f} s")
        for name, data in cases.items():
            section = WorkloadSection.model_validate(data)
            best, count, tokens = _time(section, tokenizer, args.repeats)
            results.append(
                {"case": name, "seconds": round(best, 3), "requests": count, "tokens": tokens}
            )
            print(
                f"{name:28s} {count:6,} requests {tokens:9,} prompt tokens  {best:6.2f} s "
                f"(best of {args.repeats})"
            )
    write_results(args.json, {"benchmark": "tokenize_dataset", "requests": n}, results)


if __name__ == "__main__":
    main()
