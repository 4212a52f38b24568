"""32 sandboxes created at once through the real e2b SDK, with the node agent's admission
and sharing figures reported beside them (the same code as `venusrl bench sandbox --only
e2b`, whose JSON holds the timed figures)."""

from __future__ import annotations

import json

import pytest

e2b = pytest.importorskip("e2b", reason="the e2b SDK is in the dev extra")

pytestmark = pytest.mark.needs_root  # real sandboxes: see conftest.py


def test_32_sandboxes_at_once_through_the_sdk_with_admission_and_sharing_figures():
    from tests.sandbox.cluster_helpers import CREATED

    from venusrl.bench.sandbox_e2b import ServedCluster, concurrent

    served = ServedCluster()
    CREATED.append(served.cluster)  # the session's leak check covers it
    try:
        figures = concurrent(served.cluster.controller, e2b, 32)
        print(json.dumps(figures, indent=2))
        (node,) = figures["nodes"].values()
        assert node["sandboxes"] == 32  # every one admitted, and alive while measured
        assert node["m_used_mib"] < node["threshold_mib"] <= node["m_total_mib"]  # Algorithm 1 had room for each
        assert node["oom_kills"] == 0 and node["oom_events"] == 0
        shared = figures["per_sandbox_mib"]
        assert shared["pss"] < shared["rss"]  # zygote pages are shared between the 32
        assert figures["create"]["n"] == figures["first_command"]["n"] == 32
        assert served.cluster.controller.routes == {}  # all killed again
    finally:
        served.close()
