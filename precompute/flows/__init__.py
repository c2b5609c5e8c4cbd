"""Prefect flows: the nightly schedule that runs each output's job and publishes it.

Set here, before anything imports Prefect, for every process that runs a flow (`precompute run`,
`schedule`, the benches, the tests):
- Prefect's temporary server otherwise tries to report telemetry, which fails offline;
- and is given 20 s to start, too few on a loaded machine: a run failed before any work.
"""

import os

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
