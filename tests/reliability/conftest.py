"""Fixtures the reliability tests share."""

import pytest

from tests.helpers import make_dataset


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A small prepared char dataset, made once per module (tests copy it before they damage it)."""
    return make_dataset(tmp_path_factory.mktemp("hostile-data"))
