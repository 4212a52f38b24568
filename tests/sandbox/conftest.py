"""Fixtures for sandbox tests.

Tests that run real sandboxes (cgroups, namespaces, loop mounts) need root; they carry the
`needs_root` mark (or use the `cluster` fixture) and are skipped, saying so, elsewhere.
The pure tests (Algorithm 1, placement, seccomp program, uid leases, config) run everywhere.
Every cluster gets a unique cgroup root and is removed, leaving nothing behind.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from tests.sandbox.cluster_helpers import CREATED, MiB, make_cluster

from venusrl.sandbox.cgroups import CGROUP_ROOT, detect_layout

NEEDS_ROOT = "needs root and a cgroup filesystem: it runs real sandboxes (cgroups, namespaces, mounts)"


def privileged() -> bool:
    return os.geteuid() == 0 and Path(CGROUP_ROOT).exists()


def pytest_configure(config):
    config.addinivalue_line("markers", f"needs_root: {NEEDS_ROOT}")


@pytest.fixture(autouse=True)
def _skip_unless_privileged(request):
    if request.node.get_closest_marker("needs_root") and not privileged():
        pytest.skip(f"real-sandbox test: {NEEDS_ROOT}")


@pytest.fixture(scope="session", autouse=True)
def _no_leaked_cgroups_or_mounts():
    yield
    if privileged():
        layout = detect_layout()
        leaked = [c.cgroup_root for c in CREATED if any(d.exists() for d in layout.dirs(c.cgroup_root))]
        assert not leaked, f"tests leaked cgroups: {leaked}"
        mounts = Path("/proc/self/mountinfo").read_text()
        leaked = [str(c.workdir) for c in CREATED if f" {c.workdir}/" in mounts]
        assert not leaked, f"tests leaked mounts (quota filesystems) under: {leaked}"


@pytest.fixture(scope="module")
def cluster():
    """Two nodes of 1 GiB shared by the tests of one module."""
    if not privileged():
        pytest.skip(f"real-sandbox test: {NEEDS_ROOT}")
    c = make_cluster([1024 * MiB, 1024 * MiB])
    yield c
    c.close()


from tests.sandbox.image_fixtures import test_images  # noqa: E402, F401 - shared by the image tests


@pytest.fixture(scope="module")
def e2b_service(cluster):
    """The E2B-compatible service over the module's cluster, with the SDK's environment
    pointed at it (as a user would: E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY)."""
    pytest.importorskip("e2b", reason="the e2b SDK is in the dev extra")
    from venusrl.sandbox.e2b.app import E2BServer
    from venusrl.sandbox.e2b.service import E2BService

    with E2BServer(E2BService(cluster.controller, api_key="e2b_test_key")) as server, server.sdk_environment():
        yield server
