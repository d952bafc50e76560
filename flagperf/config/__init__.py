"""Configuration: YAML reading, config models and FlagPerf's override rules, suites, case and vendor
discovery, the plan (everything resolved once) and the job a host is given."""
