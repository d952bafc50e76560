"""Prefect flows (composition only) and the `flagperf` command that starts them."""
