"""The DuckDB run database: schema, writer, opening, run lookup and merging. No torch.

What a run's rows mean (its summary, latencies, findings) is computed in ``mrv2_prof.analysis``.

What the file promises other tools is in docs/architecture.md ("Store contract").
"""

from mrv2_prof.store.db import Store, StoreError
from mrv2_prof.store.schema import FINISH_STATUSES, RUN_STATUSES, SCHEMA_VERSION, TABLES
from mrv2_prof.store.writer import BackgroundWriter

__all__ = [
    "BackgroundWriter",
    "FINISH_STATUSES",
    "RUN_STATUSES",
    "SCHEMA_VERSION",
    "TABLES",
    "Store",
    "StoreError",
]
