"""Results: the result schema, metric arithmetic, provenance, summary, analysis, report, compare, history."""
