"""Fixtures the unit tests share."""

from __future__ import annotations

import pytest

from tests.tls import Tls, issue_tls


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Tls:
    """A CA and a serving certificate for localhost, one per test module."""
    return issue_tls(tmp_path_factory.mktemp("tls"))
