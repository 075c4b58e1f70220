"""Fixtures the reliability tests share."""

import pytest


@pytest.fixture
def prepared(data):
    """The session's small prepared char dataset (tests/conftest.data): tests copy it before they
    damage it."""
    return data


@pytest.fixture
def small_disk(tmp_path):
    """A mounted 2 MiB tmpfs, to fill for real (unmounted afterwards; skipped where mounting is
    not permitted)."""
    from tests.helpers import tmpfs

    with tmpfs(tmp_path / "disk", "2m") as disk:
        yield disk
