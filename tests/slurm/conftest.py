import os

import pytest

from tests.conftest import run_cli
from tests.helpers import make_dataset
from tests.slurm.cluster import Cluster, Unavailable


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    cluster = Cluster(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
    except Unavailable as e:
        if os.environ.get("CI"):
            pytest.fail(f"the Slurm tests must run in CI: {e}")
        pytest.skip(str(e))
    yield cluster
    cluster.stop()


@pytest.fixture
def slurm(slurm_cluster, monkeypatch):
    """Point the gptrain CLI (and everything it starts) at the test cluster."""
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    return slurm_cluster


@pytest.fixture
def dataset(slurm, tmp_path):
    """A tiny char dataset pushed to this test's GPTRAIN_HOME, for jobs on the test cluster."""
    assert run_cli("data", "push", "tiny", make_dataset(tmp_path)).returncode == 0
    return "tiny"
