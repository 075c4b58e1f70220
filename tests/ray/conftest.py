import importlib.util

import pytest

from tests.conftest import run_cli
from tests.helpers import make_dataset



def _no_ray() -> bool:
    try:
        return importlib.util.find_spec("ray") is None
    except (ImportError, ValueError):  # hidden (sys.modules["ray"] = None)
        return True


NO_RAY = _no_ray()
SKIP = "Ray is not installed here: pip install 'gptrain[ray]' (`make test` does) to run tests/ray"


@pytest.fixture(scope="session")
def cluster():
    """A real two-node Ray cluster for the whole session (tests/ray/cluster.py)."""
    if NO_RAY:
        pytest.skip(SKIP)
    from tests.ray.cluster import Cluster

    c = Cluster()
    try:
        yield c.start(nodes=2)
    finally:
        c.stop()


@pytest.fixture
def ray_job(cluster, tmp_path, isolated_home, monkeypatch):
    """This test's GPTRAIN_HOME on the cluster (RAY_ADDRESS), with a tiny dataset `tiny` pushed;
    no job left running after it."""
    from tests.job_helpers import stop_all
    monkeypatch.setenv("RAY_ADDRESS", cluster.address)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert run_cli("data", "push", "tiny", make_dataset(tmp_path)).returncode == 0
    yield cluster
    stop_all()
