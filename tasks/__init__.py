"""Prefect tasks: one module per stage, each a small action on one host."""
