"""Cgroup code paths. v1 runs against this machine's kernel; v2 against a directory laid
out like a unified hierarchy (the kernel interface is a boundary we do not own), checking
exactly which files get written."""

from __future__ import annotations

import uuid

import pytest

from venusrl.sandbox.cgroups import Cgroup, CgroupLayout, OomWatcher, detect_layout

MiB = 1 << 20


def _fake_v2(tmp_path):
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids\n")
    (root / "cgroup.subtree_control").write_text("")
    return root


def _populate(cg_dir, events="low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n"):
    for name, text in {"cgroup.subtree_control": "", "memory.events": events, "memory.current": "1048576\n",
                       "memory.stat": "anon 4096\ninactive_file 8192\n", "cgroup.procs": ""}.items():
        (cg_dir / name).write_text(text)


def test_v2_is_detected_and_delegates_controllers(tmp_path):
    root = _fake_v2(tmp_path)
    layout = detect_layout(root)
    assert layout == CgroupLayout(2, root)
    (root / "venusrl-x").mkdir()  # the kernel gives every new cgroup its interface files
    (root / "venusrl-x" / "cgroup.subtree_control").write_text("")
    Cgroup(layout, "venusrl-x/node-0").create()
    assert (root / "cgroup.subtree_control").read_text() == "+memory +pids"
    assert (root / "venusrl-x" / "cgroup.subtree_control").read_text() == "+memory +pids"
    assert (root / "venusrl-x" / "node-0").is_dir()


def test_v2_holds_oom_with_memory_high_and_freezes_with_cgroup_freeze(tmp_path):
    root = _fake_v2(tmp_path)
    node = Cgroup(detect_layout(root), "n").create()
    _populate(root / "n")
    node.hold_oom(512 * MiB)
    assert (root / "n" / "memory.high").read_text() == str(512 * MiB)
    assert int((root / "n" / "memory.max").read_text()) > 512 * MiB
    node.set_pids_limit(64)
    assert (root / "n" / "pids.max").read_text() == "64"
    node.freeze()
    assert (root / "n" / "cgroup.freeze").read_text() == "1" and node.frozen()
    node.thaw()
    assert not node.frozen()
    assert node.working_set() == 1048576 - 8192
    assert node.oom_kills() == 0


def test_v2_pressure_is_seen_from_memory_events(tmp_path):
    root = _fake_v2(tmp_path)
    node = Cgroup(detect_layout(root), "n").create()
    _populate(root / "n")
    watcher = OomWatcher(node)
    assert not watcher.wait(0.01)
    (root / "n" / "memory.events").write_text("low 0\nhigh 3\nmax 0\noom 0\noom_kill 0\n")
    assert watcher.wait(0.01)
    assert not watcher.wait(0.01)  # only a rise counts


def test_no_usable_hierarchy_is_a_clear_error(tmp_path):
    with pytest.raises(RuntimeError, match="no usable cgroup hierarchy"):
        detect_layout(tmp_path)


@pytest.mark.needs_root
def test_real_cgroup_lifecycle_and_oom_eventfd():
    layout = detect_layout()
    cg = Cgroup(layout, f"venusrl-test-{uuid.uuid4().hex[:8]}/node").create()
    try:
        cg.hold_oom(64 * MiB)
        watcher = OomWatcher(cg)
        assert not watcher.wait(0.01)
        assert cg.memory_usage() >= 0 and cg.pids() == []
        watcher.close()
    finally:
        Cgroup(layout, cg.rel.split("/")[0]).remove()
    assert not cg.exists()

