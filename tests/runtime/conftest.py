import pytest


@pytest.fixture(scope="module")
def ray_on_loopback():
    """A two-CPU Ray instance on this node for one test module."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def three_node_cluster(tmp_path_factory):
    """A three-node Ray cluster, each node in its own network namespace (ray_cluster.py);
    skipped, naming what is missing, where namespaces cannot be made."""
    pytest.importorskip("ray")
    from tests.runtime.ray_cluster import NamespacedCluster, Unavailable

    cluster = NamespacedCluster(tmp_path_factory.mktemp("cluster"))
    try:
        cluster.start(workers=2)
    except Unavailable as missing:
        cluster.close()
        pytest.skip(str(missing))
    except BaseException:
        cluster.close()
        raise
    yield cluster
    cluster.close()
