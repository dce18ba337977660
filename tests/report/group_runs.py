"""Hand-made groups of repeats for the gate's statistics: runs whose only measured figures are
the start-up and capture times of ``runs.info``, so each metric's per-run values are known."""

from __future__ import annotations

from pathlib import Path

from mrv2_prof.store import Store

ENV = {"cpu_model": "X", "cpu_count": 8, "torch": "2.9", "cuda": None, "torch_threads": 8}


def add_group(
    store: Store,
    group: str,
    startup_s: list[float],
    *,
    device: str = "cpu",
    environment: dict | None = None,
    notes: tuple[str, ...] = (),
    scenario_yaml: str = "name: g\nseed: 0\n",
) -> list[str]:
    """One run per value, ``{group}-{i}``, in group ``group`` (repeat ``i``)."""
    run_ids = []
    for i, value in enumerate(startup_s):
        run_id = f"{group}-{i}"
        store.begin_run(
            run_id,
            scenario_name="g",
            label="g",
            matrix_combo=None,
            scenario_yaml=scenario_yaml,
            device=device,
            versions={},
            started_ns=i,
            info={"startup_s": value, "capture_s": value / 10, "notes": list(notes)},
        )
        store.update_run(
            run_id,
            run_group=group,
            repeat_index=i,
            environment=ENV if environment is None else environment,
        )
        store.finish_run(run_id, "completed", ended_ns=i + 1)
        run_ids.append(run_id)
    return run_ids


def make_groups(path: Path, groups: dict[str, list[float]], **kwargs) -> Path:
    with Store.open(path) as store:
        for group, values in groups.items():
            add_group(store, group, values, **kwargs)
    return path
