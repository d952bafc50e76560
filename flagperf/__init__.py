"""FlagPerf on Prefect: the core shared by the controller and the hosts.

Nothing in this package imports Prefect, so a host (or a container) can run cases with torch alone.
"""

__version__ = "0.1.0"
