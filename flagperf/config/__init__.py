"""Configuration: YAML reading, config models and FlagPerf's override rules, suites, case and vendor discovery, the plan, the job."""
