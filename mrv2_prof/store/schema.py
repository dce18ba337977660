"""The run database's schema: one table per probe, keyed by ``run_id`` (and ``baselines``).

``TABLES`` declares every table's columns once (name and DuckDB type, in table order). Derived
from it: the DDL and the upgrade of an older file (here), the store's column checks on append
(``store.db``), and the probes' record buffers, drain and row-to-column conversion
(``probes.columns``). Plain data: this module imports nothing, so the probes can import it. Every
timestamp is int64 ns of ``time.perf_counter_ns()``. What the tables promise other tools:
docs/architecture.md ("Store contract").
"""

from __future__ import annotations

SCHEMA_VERSION = 9
# Version 1 lacked the columns marked v2, version 2 the columns and tables marked v3, version 3
# those marked v4, version 4 those marked v5, version 5 those marked v6, version 6 those marked
# v7, version 7 those marked v8, version 8 those marked v9; a writable open of such a file adds
# them (``upgrade_ddl``), a read-only one shows them as NULL (``store.opening``).

RUN_STATUSES = ("running", "completed", "failed", "aborted")
FINISH_STATUSES = ("completed", "failed", "aborted")

TABLES: dict[str, list[tuple[str, str]]] = {
    "runs": [
        ("run_id", "VARCHAR"),
        ("scenario_name", "VARCHAR"),
        ("label", "VARCHAR"),  # scenario name plus matrix combination
        ("matrix_combo", "VARCHAR"),  # JSON object of the combination, or NULL
        ("scenario_yaml", "VARCHAR"),
        ("status", "VARCHAR"),  # running | completed | failed | aborted
        ("started_ns", "BIGINT"),  # perf_counter_ns clock, comparable with every *_ns column
        ("ended_ns", "BIGINT"),
        ("started_at", "TIMESTAMP"),  # wall clock (local time), for listing and ordering runs
        ("device", "VARCHAR"),
        ("versions", "VARCHAR"),  # JSON
        ("error", "VARCHAR"),
        ("info", "VARCHAR"),  # JSON of runtime facts: dtype, model_params, num_kv_blocks, notes
        ("scenario_given_yaml", "VARCHAR"),  # v3: as given (file + --set); scenario_yaml: as run
        ("environment", "VARCHAR"),  # v3: JSON: host CPU, load, threads, torch/CUDA/driver/GPU
        ("writer_pid", "BIGINT"),  # v3: the process that writes the run (its runner process)
        ("writer_host", "VARCHAR"),  # v3: the host it runs on
        ("run_group", "VARCHAR"),  # v4: the repeats of one combination share it (--repeats)
        ("repeat_index", "INTEGER"),  # v4: 0-based repeat within the group
    ],
    "steps": [
        ("run_id", "VARCHAR"),
        ("step", "BIGINT"),
        ("cpu_start_ns", "BIGINT"),
        ("cpu_end_ns", "BIGINT"),
        ("gpu_start_ns", "BIGINT"),
        ("gpu_end_ns", "BIGINT"),
        ("num_reqs", "INTEGER"),
        ("num_tokens", "INTEGER"),
        ("num_prefill_tokens", "INTEGER"),
        ("num_decode_tokens", "INTEGER"),
        ("graph_mode", "VARCHAR"),
        ("overlap_frac", "DOUBLE"),  # hidden / host prep of this step, NULL without GPU times
        ("bubble_ns", "BIGINT"),  # GPU idle before this step, NULL without GPU times
        ("bubble_kind", "VARCHAR"),  # v2: host_bound | other (NULL when bubble_ns is NULL)
        ("host_prep_ns", "BIGINT"),  # v2: schedule start to end of enqueueing
        ("hidden_prep_ns", "BIGINT"),  # v2: the part of it while the GPU ran the previous step
        ("output_wait_ns", "BIGINT"),
        ("num_waiting", "INTEGER"),
        ("num_running", "INTEGER"),
        ("kv_used_blocks", "INTEGER"),
        ("num_preempted", "INTEGER"),
        ("starved_ns", "BIGINT"),  # v3: device waiting for the host inside the step's spans
        ("perturbed", "BOOLEAN"),  # v3: a probe slowed this step (kernel-trace window)
        ("spec_k", "INTEGER"),  # v5: speculative decoding: the step's k (0: no drafts)
        ("num_draft_tokens", "INTEGER"),  # v5: drafts in the batch queued in this step
        ("num_accepted_tokens", "INTEGER"),  # v5: accepted drafts among the tokens read in it
        # v7: speculative decoding's slots and dynamic k (0 / NULL without speculation)
        ("spec_reserved", "INTEGER"),  # draft slots scheduled in the batch queued (KV, budget)
        ("spec_reclaimed", "INTEGER"),  # of the verifies read: slots less accepted drafts
        ("spec_sat_out", "INTEGER"),  # requests that sat out for speculation (host drafts)
        ("spec_expected_tokens", "DOUBLE"),  # dynamic k: tokens a verify emits at its best k > 0
        ("spec_cost_ratio", "DOUBLE"),  # dynamic k: step time at that k / at k = 0
        # v8: the step's attention extent (the roofline's KV bytes and attention FLOPs)
        ("context_tokens", "BIGINT"),  # KV tokens read: each request's context after it
        ("attn_pairs", "BIGINT"),  # query-key pairs scored (both -1: not known)
    ],
    "spans": [
        ("run_id", "VARCHAR"),
        ("step", "BIGINT"),
        ("track", "VARCHAR"),  # cpu | gpu
        ("name", "VARCHAR"),
        ("start_ns", "BIGINT"),
        ("end_ns", "BIGINT"),
        ("starved_ns", "BIGINT"),  # v3: gpu track: the part the device waited for the host
    ],
    "syncs": [
        ("run_id", "VARCHAR"),
        ("step", "BIGINT"),
        ("t_ns", "BIGINT"),
        ("kind", "VARCHAR"),
        ("site", "VARCHAR"),  # file:line of the first frame in mrv2_prof
        ("blocked_ns", "BIGINT"),
    ],
    "graph_dispatch": [
        ("run_id", "VARCHAR"),
        ("step", "BIGINT"),
        ("num_tokens", "INTEGER"),
        ("padded_tokens", "INTEGER"),
        ("requested_mode", "VARCHAR"),
        ("mode", "VARCHAR"),
        ("hit", "BOOLEAN"),
        ("reason", "VARCHAR"),
    ],
    "graph_captures": [
        ("run_id", "VARCHAR"),
        ("key", "VARCHAR"),
        ("mode", "VARCHAR"),
        ("num_tokens", "INTEGER"),
        ("capture_s", "DOUBLE"),
        ("mem_bytes", "BIGINT"),
        ("step", "BIGINT"),  # v9: the step that captured it on first use; -1: at start-up
    ],
    "staged_writes": [
        ("run_id", "VARCHAR"),
        ("step", "BIGINT"),
        ("tensor", "VARCHAR"),
        ("rows", "INTEGER"),
        ("elements", "BIGINT"),
        ("staged_bytes", "BIGINT"),
        ("dense_bytes", "BIGINT"),
    ],
    "requests": [
        ("run_id", "VARCHAR"),
        ("req_id", "VARCHAR"),
        ("arrival_ns", "BIGINT"),
        ("first_token_ns", "BIGINT"),
        ("finish_ns", "BIGINT"),
        ("prompt_tokens", "INTEGER"),
        ("output_tokens", "INTEGER"),
        ("num_preemptions", "INTEGER"),
        ("finish_reason", "VARCHAR"),  # stop | length | abort, NULL while unfinished
        ("cached_tokens", "INTEGER"),  # prefix-cache hit tokens at first scheduling
        # v6: decoded from the token ids on the writer thread (request_texts.py); NULL when the
        # model has no tokenizer. The prompt with special tokens kept (the chat template as the
        # model saw it), from the request's first row on; the output with them skipped (as
        # vLLM), once it finished (NULL while in flight and for a request never finished)
        ("prompt_text", "VARCHAR"),
        ("output_text", "VARCHAR"),
    ],
    "tokens": [
        ("run_id", "VARCHAR"),
        ("req_id", "VARCHAR"),
        ("idx", "INTEGER"),  # 0-based output position
        ("t_ns", "BIGINT"),  # host time the token was known
        ("token_id", "INTEGER"),
    ],
    "gpu_samples": [
        ("run_id", "VARCHAR"),
        ("t_ns", "BIGINT"),
        ("gpu_util", "DOUBLE"),
        ("mem_used_bytes", "BIGINT"),
        ("power_w", "DOUBLE"),
        ("sm_clock_mhz", "DOUBLE"),
        ("energy_mj", "BIGINT"),  # v8: NVML's total energy counter (mJ since the driver loaded)
    ],
    "copies": [
        ("run_id", "VARCHAR"),
        ("step", "BIGINT"),
        ("direction", "VARCHAR"),
        ("bytes", "BIGINT"),
        ("pinned", "BOOLEAN"),
        ("contiguous", "BOOLEAN"),
        ("non_blocking", "BOOLEAN"),
        ("host_ns", "BIGINT"),
    ],
    "kernels": [
        ("run_id", "VARCHAR"),
        ("step", "BIGINT"),
        ("phase", "VARCHAR"),
        ("name", "VARCHAR"),
        ("start_ns", "BIGINT"),
        ("end_ns", "BIGINT"),
        ("stream", "BIGINT"),
    ],
    "rank_steps": [  # v4: tensor parallelism: each rank's host span of each step
        ("run_id", "VARCHAR"),
        ("rank", "INTEGER"),
        ("step", "BIGINT"),
        ("start_ns", "BIGINT"),  # the rank's queue_step began (perf_counter_ns, one host)
        ("end_ns", "BIGINT"),  # the rank's step was done (worker ranks: its tokens read)
        ("comm_ns", "BIGINT"),  # host time in the step's collectives (gloo: synchronous)
    ],
    "spec_verifies": [  # v5: one row per verify of a request's drafts
        ("run_id", "VARCHAR"),
        ("step", "BIGINT"),  # the step its tokens were read in
        ("req_id", "VARCHAR"),
        ("num_draft_tokens", "INTEGER"),  # drafts verified
        ("num_accepted_tokens", "INTEGER"),  # the accepted prefix of them
    ],
    "host_samples": [  # v3: the host sampler (probes.host_sampling_hz)
        ("run_id", "VARCHAR"),
        ("step", "BIGINT"),  # the step the sample fell in (-1: before the first)
        ("t_ns", "BIGINT"),
        ("phase", "VARCHAR"),  # the CPU phase open at the sample, idle, or startup (step -1)
        ("stack", "VARCHAR"),  # root first, frames "qualname (file)" joined by ";"
        ("depth", "INTEGER"),  # frames in the stack
    ],
    "compiles": [  # v8: a kernel compiled while the run ran (a launcher cache miss)
        ("run_id", "VARCHAR"),
        ("step", "BIGINT"),  # the step it happened in (-1: start-up, before the first step)
        ("t_ns", "BIGINT"),  # when the compile began
        ("source", "VARCHAR"),  # triton | torch
        ("kernel", "VARCHAR"),  # the kernel's name
        ("key", "VARCHAR"),  # its specialization key (signature, constants, options)
        ("compile_ms", "DOUBLE"),  # wall time of the compile
        ("after_warmup", "BOOLEAN"),  # the run had begun serving: a request paid for it
    ],
    "baselines": [  # v4: named baselines (mrv2-prof baseline set NAME RUN_OR_GROUP)
        ("name", "VARCHAR"),  # the key: baseline:NAME names it
        ("kind", "VARCHAR"),  # run | group
        ("target", "VARCHAR"),  # the run id or the run_group
        ("set_at", "TIMESTAMP"),  # wall clock (local time) of the last set
    ],
}

META_TABLE = "meta"


def quote(name: str) -> str:
    """A DuckDB identifier, quoted (column names such as ``key`` and ``bytes`` stay safe)."""
    return '"' + name.replace('"', '""') + '"'


def table_ddl(table: str) -> str:
    """CREATE TABLE for one table of ``TABLES``: ``run_id`` is NOT NULL, and the key of ``runs``."""
    cols = []
    for name, sql_type in TABLES[table]:
        if name == "run_id":
            sql_type += " PRIMARY KEY" if table == "runs" else " NOT NULL"
        cols.append(f"{quote(name)} {sql_type}")
    return f"CREATE TABLE {quote(table)} ({', '.join(cols)})"


def upgrade_ddl(existing: dict[str, set[str]]) -> list[str]:
    """ALTER statements adding the columns of ``TABLES`` an older file lacks (new tables too)."""
    statements = []
    for table, cols in TABLES.items():
        if table not in existing:
            statements.append(table_ddl(table))
            continue
        for name, sql_type in cols:
            if name not in existing[table]:
                statements.append(f"ALTER TABLE {quote(table)} ADD COLUMN {quote(name)} {sql_type}")
    statements.append(
        f"UPDATE {META_TABLE} SET value = '{SCHEMA_VERSION}' WHERE key = 'schema_version'"
    )
    return statements


def schema_ddl() -> list[str]:
    """Every statement that creates an empty run database at ``SCHEMA_VERSION``."""
    return [
        f"CREATE TABLE {META_TABLE} (key VARCHAR PRIMARY KEY, value VARCHAR)",
        *(table_ddl(table) for table in TABLES),
        f"INSERT INTO {META_TABLE} VALUES ('schema_version', '{SCHEMA_VERSION}')",
    ]
