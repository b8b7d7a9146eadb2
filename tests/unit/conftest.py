"""Fixtures the unit tests share."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from nri_midbatch.cgroups import fs
from tests.fake_cgroups import kernel_checked
from tests.tls import Tls, issue_tls


@pytest.fixture(scope="session", autouse=True)
def kernel_rules_for_the_plugin() -> Iterator[None]:
    """The plugin's cgroupfs writes into a fake v1 tree refused where the kernel refuses
    them (tests/fake_cgroups.py); any other file is written as before."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fs, "_write", kernel_checked(fs._write))
        yield


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
