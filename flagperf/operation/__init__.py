"""The operation family: operators x dtypes x shapes, each implementation checked against a higher-precision
reference before it is timed (flagperf.operation.driver)."""
