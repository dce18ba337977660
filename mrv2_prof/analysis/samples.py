"""One run's latency distributions as samples: TTFT and TPOT per completed request, and the
inter-token gaps (ITL), by the definitions of ``store.latency`` (the gaps that end inside the
perturbed window, a kernel trace, left out as in the summary). ``compare`` and ``gate``
bootstrap these when one run a side is all there is."""

from __future__ import annotations

from mrv2_prof.analysis.latency import latency_values
from mrv2_prof.store.db import Store


def latency_samples(store: Store, run_id: str) -> dict[str, list[float]]:
    """``{"ttft": [...], "tpot": [...], "itl": [...]}`` in ms, each sorted."""
    return {
        name: latency_values(store.connection, run_id, name) for name in ("ttft", "tpot", "itl")
    }
