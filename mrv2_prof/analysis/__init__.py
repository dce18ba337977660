"""What the tool concludes from a stored run: the summary ``run`` and ``show`` print, the findings
and their rules (``host_contention`` among them). Views render what this package computes. The
map: docs/architecture.md."""
