"""The DuckDB run database: schema, writer, run lookup and metric queries. No torch.

What the file promises other tools is in docs/architecture.md ("Store contract").
"""

from mrv2_prof.store.db import Store, StoreError
from mrv2_prof.store.metrics import Percentiles, RunSummary, run_summary
from mrv2_prof.store.schema import FINISH_STATUSES, RUN_STATUSES, SCHEMA_VERSION, TABLES
from mrv2_prof.store.writer import BackgroundWriter

__all__ = [
    "BackgroundWriter",
    "FINISH_STATUSES",
    "RUN_STATUSES",
    "SCHEMA_VERSION",
    "TABLES",
    "Percentiles",
    "RunSummary",
    "Store",
    "StoreError",
    "run_summary",
]
