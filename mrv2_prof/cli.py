"""The ``mrv2-prof`` command line. Bad input ends with one line on stderr and exit code 2."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from mrv2_prof.quickstart import QuickstartWorkload, RunSummary, run_workload
from mrv2_prof.runner.config import ConfigError, ModelSpec, RunnerConfig
from mrv2_prof.runner.model_loader import CheckpointError

app = typer.Typer(
    help="Profile an embedded vLLM Model Runner V2 style runner.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err = Console(stderr=True)
out = Console()


def fail(message: str) -> None:
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


@app.callback()
def main() -> None:
    """mrv2-prof: what each MRV2 mechanism buys on your GPU and workload."""


@app.command()
def run(
    preset: str = typer.Option("llama-tiny", help="Model preset with random weights by seed."),
    model_path: Path = typer.Option(
        None, "--model-path", help="Local Hugging Face directory (config.json + *.safetensors)."
    ),
    device: str = typer.Option("auto", help="auto | cuda | cpu"),
    dtype: str = typer.Option(
        None, help="float32 | bfloat16 | float16 (default: fp32 on CPU, bf16 on CUDA)"
    ),
    num_requests: int = typer.Option(16, min=1, help="Synthetic requests, all arriving at once."),
    prompt_len: str = typer.Option("16:96", help="Prompt length MIN:MAX (uniform)."),
    output_len: int = typer.Option(32, min=1, help="Output tokens per request (EOS ignored)."),
    temperature: float = typer.Option(0.0, min=0.0, help="0 = greedy."),
    max_num_seqs: int = typer.Option(256, min=1),
    max_num_batched_tokens: int = typer.Option(2048, min=1),
    max_model_len: int = typer.Option(1024, min=2),
    block_size: int = typer.Option(16, min=1),
    num_kv_blocks: int = typer.Option(
        None, min=1, help="KV cache blocks (default: 512 on CPU, from memory on CUDA)."
    ),
    staged_writes: bool = typer.Option(True, help="StagedWriteTensor (off: dense copy per step)."),
    seed: int = typer.Option(0),
    json_out: Path = typer.Option(None, "--json", help="Also write the summary as JSON here."),
) -> None:
    """Run the embedded quickstart workload through the MRV2 runner and print a summary.

    With no options this is a CPU-safe run of the tiny preset. Scenario files, the DuckDB store
    and the live dashboard build on this command.
    """
    try:
        lo, hi = (int(x) for x in prompt_len.split(":"))
        if not 1 <= lo <= hi:
            raise ValueError
    except ValueError:
        fail(f"--prompt-len: expected MIN:MAX with 1 <= MIN <= MAX, got {prompt_len!r}")
    try:
        spec = ModelSpec(
            preset=None if model_path else preset,
            path=str(model_path) if model_path else None,
            dtype=dtype,
            seed=seed,
        )
        config = RunnerConfig(
            device=device,
            max_num_seqs=max_num_seqs,
            max_num_reqs=max(1024, max_num_seqs),
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=max_model_len,
            block_size=block_size,
            num_kv_blocks=num_kv_blocks
            if num_kv_blocks or device == "cuda"
            else _cpu_blocks(device),
            staged_writes=staged_writes,
            seed=seed,
        )
        workload = QuickstartWorkload(
            num_requests=num_requests,
            prompt_len_min=lo,
            prompt_len_max=hi,
            output_len=output_len,
            temperature=temperature,
            seed=seed,
        )
        with Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total} tokens"),
            TimeElapsedColumn(),
            console=err,
            transient=True,
        ) as progress:
            task = progress.add_task("loading model", total=num_requests * output_len)

            def on_step(done: int, total: int) -> None:
                progress.update(task, description="generating", completed=done)

            summary = run_workload(config, spec, workload, on_step)
    except (ConfigError, CheckpointError) as e:
        fail(str(e))
    except ValueError as e:
        fail(str(e))
    _print_summary(summary)
    if json_out is not None:
        json_out.write_text(json.dumps(dataclasses.asdict(summary), indent=2))


def _cpu_blocks(device: str) -> int | None:
    """On CPU the cache size cannot be derived from GPU memory: use a fixed default."""
    import torch

    if device == "cpu" or not torch.cuda.is_available():
        return 512
    return None


def _print_summary(s: RunSummary) -> None:
    from rich.table import Table

    t = Table(title="mrv2-prof run", show_header=False, title_justify="left")
    t.add_column(style="bold")
    t.add_column(justify="right")
    rows = [
        ("device / dtype", f"{s.device} / {s.dtype}"),
        ("model parameters", f"{s.model_params / 1e6:.1f} M"),
        ("KV cache blocks", str(s.num_kv_blocks)),
        ("requests", str(s.num_requests)),
        ("steps", str(s.steps)),
        ("prompt / output tokens", f"{s.prompt_tokens} / {s.output_tokens}"),
        ("start-up", f"{s.startup_s:.2f} s"),
        ("wall time", f"{s.wall_s:.2f} s"),
        ("output tokens/s", f"{s.output_tokens_per_s:.1f}"),
        ("total tokens/s", f"{s.total_tokens_per_s:.1f}"),
        ("step wall p50", f"{s.step_wall_ms_p50:.2f} ms"),
        ("step host p50 / p90", f"{s.step_host_ms_p50:.2f} / {s.step_host_ms_p90:.2f} ms"),
        (
            "decode step wall / host p50",
            f"{s.decode_step_wall_ms_p50:.2f} / {s.decode_step_host_ms_p50:.2f} ms",
        ),
        ("preemptions", str(s.num_preemptions)),
        ("prefix-cache hit tokens", str(s.prefix_cache_hit_tokens)),
    ]
    for k, v in rows:
        t.add_row(k, v)
    out.print(t)
    for note in s.notes:
        out.print(f"[yellow]note:[/] {note}", highlight=False)
