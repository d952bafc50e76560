"""The planner's limits (a suite's rounds and --rounds; a case's nnodes), defined once: a plan.json beyond them is not
one it wrote; and the other numeric inputs' limits that a command's help or error names (the flow or the form enforces
them). No imports, so that the command line's help can name them without loading the result schema."""

MAX_ROUNDS = 100
MAX_NNODES = 1024
# The host rounds one plan.json may list (cases x rounds x hosts): far beyond any fleet's night (1,000 hosts x 50
# cases x 10 rounds), so a small crafted plan of thousands of names cannot make a reader build a list that fills
# memory; a plan beyond it is read as not one the planner wrote (counts only)
MAX_PLANNED_HOST_ROUNDS = 500_000
# Earlier good nights whose median is a figure's baseline (flagperf.config.night.BASELINE_RUNS enforces it)
MAX_BASELINE_RUNS = 1000
# Seconds between monitor samples: 10 Hz at most, the monitor's own limit (flows.evaluate enforces it)
MIN_MONITOR_INTERVAL_S, MAX_MONITOR_INTERVAL_S = 0.1, 60.0
