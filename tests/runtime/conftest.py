import pytest


@pytest.fixture(scope="module")
def ray_on_loopback():
    """A two-CPU Ray instance on this node for one test module."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()
