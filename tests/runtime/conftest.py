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
    """A three-node Ray cluster, each node in its own network namespace (ray_cluster.py):
    the head the trainer's node, two engine and sandbox nodes."""
    yield from _cluster(tmp_path_factory, None)


@pytest.fixture(scope="module")
def trainer_apart_cluster(tmp_path_factory):
    """Three nodes: the head (the run's driver only), the trainer's node (rollout and trainer
    actors) and an engine node."""
    yield from _cluster(tmp_path_factory, [({}, 1), ({"venusrl_trainer": 1.0}, 2), ({"venusrl_engine": 1.0}, 1)])


def _cluster(tmp_path_factory, roles):
    """Skipped, naming what is missing, where namespaces cannot be made."""
    pytest.importorskip("ray")
    from tests.runtime.ray_cluster import NamespacedCluster, Unavailable

    cluster = NamespacedCluster(tmp_path_factory.mktemp("cluster"))
    try:
        cluster.start(workers=len(roles) - 1 if roles else 2, roles=roles)
    except Unavailable as missing:
        cluster.close()
        pytest.skip(str(missing))
    except BaseException:
        cluster.close()
        raise
    yield cluster
    cluster.close()
