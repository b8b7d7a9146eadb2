"""Plain HTTP requests for the tests of the health and metrics endpoints."""

from __future__ import annotations

import urllib.error
import urllib.request

#: Upper bound for one request: a hang fails the test instead of blocking it. Generous,
#: as a loaded 2-core machine may be slow to answer; a passing test never waits for it.
REQUEST_TIMEOUT = 10.0


def http_get(url: str, timeout: float = REQUEST_TIMEOUT) -> tuple[int, str, str]:
    """(status, Content-Type, body) for any status, 5xx and 404 included."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            return reply.status, reply.headers["Content-Type"], reply.read().decode()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.headers["Content-Type"], error.read().decode()
