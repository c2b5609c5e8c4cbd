"""A store's outages in the service's log: one line when it goes down, one when it is back.

The detail (address, driver error) goes to the log, for operators; clients get a 503 that says
which store, without the internals.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger("lookup")


class StoreHealth:
    def __init__(self, store: str) -> None:
        self.store = store
        self.down_since: float | None = None

    def failed(self, error: Exception) -> None:
        if self.down_since is None:
            self.down_since = time.monotonic()
            log.warning("%s unavailable: %s", self.store, error)

    def ok(self) -> None:
        if self.down_since is not None:
            log.warning("%s recovered after %.1f s", self.store, time.monotonic() - self.down_since)
            self.down_since = None
