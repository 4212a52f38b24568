"""Fixtures for sandbox tests. These need root, cgroups and namespaces (the CI machine has
them); every cluster gets a unique cgroup root and is removed, leaving nothing behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from tests.sandbox.cluster_helpers import MiB, make_cluster

from venusrl.sandbox.cgroups import CGROUP_ROOT, detect_layout


def _leftover_cgroups() -> set[str]:
    layout = detect_layout()
    base = layout.root / "memory" if layout.version == 1 else layout.root
    return {p.name for p in base.iterdir() if p.name.startswith("venusrl-")}


@pytest.fixture(scope="session", autouse=True)
def _requires_root_and_no_leaks():
    if os.geteuid() != 0 or not Path(CGROUP_ROOT).exists():
        pytest.skip("sandbox tests need root and a cgroup filesystem")
    before = _leftover_cgroups()
    yield
    leaked = _leftover_cgroups() - before
    assert not leaked, f"tests leaked cgroups: {leaked}"


@pytest.fixture(scope="module")
def cluster():
    """Two nodes of 1 GiB shared by the tests of one module."""
    c = make_cluster([1024 * MiB, 1024 * MiB])
    yield c
    c.close()


from tests.sandbox.image_fixtures import test_images  # noqa: E402, F401 - shared by the image tests
