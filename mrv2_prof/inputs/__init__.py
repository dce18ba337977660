"""Reading what a user hands the tool: files opened non-blocking and type-checked first
(``input_file``), YAML with limits (``limited_yaml``), numbers bounded before any float
conversion (``finite_numbers``), free memory against what a run will allocate
(``memory_budget``). The scenario loader, the workload readers, the gate's thresholds and the
checkpoint loader all read through these (the runner may import ``input_file`` and nothing else
outside ``probes.api``)."""
