"""The planner's limits (a suite's rounds and --rounds; a case's nnodes), defined once: a plan.json beyond them is not
one it wrote. No imports, so that the command line's help can name them without loading the result schema."""

MAX_ROUNDS = 100
MAX_NNODES = 1024
