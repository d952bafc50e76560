"""Measurement: timing, the case kit every case is handed, PerfLog lines."""
