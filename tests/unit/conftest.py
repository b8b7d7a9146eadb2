"""Fixtures the unit tests share."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from tests.tls import Tls, issue_tls


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Tls:
    """A CA and a serving certificate for localhost, one per test module."""
    return issue_tls(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def switching_often() -> Iterator[None]:
    """The interpreter hands the GIL to another thread every microsecond, not every 5 ms.

    A race between threads in Python code shows within a few thousand calls instead of
    hours of traffic: each bytecode boundary and each call into Python code from C (a key's
    `__eq__` during a dict lookup) becomes a likely switch.
    """
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)
