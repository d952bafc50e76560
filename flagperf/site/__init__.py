"""The results site `flagperf server` serves beside the Prefect UI: the runs of the results folder, each run's
report and plots, two runs compared, and each figure's course over time from the history. Behind the same
sign-in as the UI; it serves what it lists and nothing else (no listings, no databases, no logs, no links).
"""
