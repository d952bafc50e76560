"""Kernels shared by several base-spec cases (a case.yaml names one with ``entry: flagperf.basespec.X``).

Each module has the case contract: ``Config`` (pydantic) and ``run(config, ctx) -> list[Metric]``.
They are device-agnostic torch: the device comes from the vendor, timing from the context."""
