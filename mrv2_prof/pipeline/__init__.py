"""The run pipeline: everything between ``mrv2-prof run`` and a run in the database.

The parent side (``launcher``: spawn the runner, relay its snapshots to a view; ``lifetime``:
signals; ``headless_progress``: the bar or the heartbeat lines) and the runner process's side
(``harness``: scenario → workload → engine loop → store; ``open_loop`` drives arrivals,
``live_stats`` feeds the views their snapshots, ``request_rows``/``request_texts``/``probe_results``
turn what ran into rows, ``run_environment``/``runner_threads`` record and set the host,
``effective_scenario`` the scenario as run). ``job`` is the
plain data that crosses the process boundary. The map: docs/architecture.md.
"""
