"""Migration applies a command's effects exactly once: a non-idempotent command (it
increments a counter file, then grows until OOM interception moves its sandbox) leaves
the counter exactly one higher once it completes on the target."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import pytest
from tests.sandbox.cluster_helpers import MiB, make_cluster

from venusrl.bench.sandbox import COUNT_THEN_GROW
from venusrl.sandbox.api import Sandbox
from venusrl.sandbox.errors import SandboxMigrated
from venusrl.sandbox.flight import CommandFence
from venusrl.sandbox.image.store import ImageStore
from venusrl.sandbox.template import Template


def _counter_after_migration(cluster, template) -> tuple[str, str]:
    c = cluster.controller
    sandbox = Sandbox(c, c.create(template, node_id="node-0", memory_limit=512 * MiB))
    sandbox.files.write("counter", "41\n")
    result = sandbox.run(COUNT_THEN_GROW, timeout=120)
    assert result.exit_code == 0, result.stderr
    # The route moves before the re-run starts; the OOM record is appended only after the
    # thaw, which may come after the re-run's result: the source's own count is the witness.
    assert c.routes[sandbox.sandbox_id].node_id == "node-1"
    assert c.nodes["node-0"].call("status")["oom_events"] == 1
    assert all(node.call("status")["oom_kills"] == 0 for node in c.nodes.values())
    return result.stdout, sandbox.files.read("counter")


@pytest.fixture(scope="module")
def image_store(test_images, tmp_path_factory):
    store = tmp_path_factory.mktemp("migration-store")
    ImageStore(store).import_image(test_images.oci_app)
    return str(store)


@pytest.mark.parametrize("kind", ["image", "base"])
def test_command_interrupted_by_migration_applies_its_effects_once(image_store, kind):
    cluster = make_cluster([200 * MiB, 1024 * MiB], image_store=image_store)
    template = Template(name=f"once-{uuid.uuid4().hex[:8]}", image="app:latest" if kind == "image" else None)
    try:
        stdout, counter = _counter_after_migration(cluster, template)
        assert stdout == "grown\n42\n"
        assert counter == "42\n"
    finally:
        cluster.close()


def test_without_the_snapshot_the_rerun_applies_it_twice(image_store):
    """The previous behaviour, kept behind `exactly_once: false`: the test above can fail."""
    cluster = make_cluster([200 * MiB, 1024 * MiB], image_store=image_store, exactly_once=False)
    try:
        _, counter = _counter_after_migration(cluster, Template(name=f"twice-{uuid.uuid4().hex[:8]}"))
        assert counter == "43\n"
    finally:
        cluster.close()


def _command_during_export(fence: CommandFence, moved_to: str | None) -> list[object]:
    outcome: list[object] = []
    started, finished = threading.Event(), threading.Event()

    def command() -> None:
        try:
            with fence.command(None, None):
                started.set()
                finished.wait()
            outcome.append("delivered")
        except SandboxMigrated as err:
            outcome.append(err)

    thread = threading.Thread(target=command)
    thread.start()
    started.wait()
    assert fence.begin_export() is True  # in flight: the export takes the snapshot
    finished.set()  # the command finishes on the source while the export is undecided
    fence.end_export(moved_to)
    thread.join()
    return outcome


def test_fence_drops_the_sources_result_when_the_move_happens():
    outcome = _command_during_export(CommandFence("sb"), "node-1")
    assert len(outcome) == 1 and isinstance(outcome[0], SandboxMigrated)


def test_fence_delivers_the_sources_result_when_the_move_is_aborted():
    fence = CommandFence("sb")
    assert _command_during_export(fence, None) == ["delivered"]
    assert fence.begin_export() is False  # nothing in flight now
    fence.end_export("node-1")
    with pytest.raises(SandboxMigrated), fence.command(None, None):
        pass  # never runs: the sandbox has moved


def test_image_sandboxes_of_a_group_share_a_node_and_survive_its_loss(image_store):
    """Group placement and recovery on node loss, as for any template: the group's
    sandboxes land together, and when their node agent dies they come back on the other
    node with their files and shell session."""
    from tests.sandbox.test_cluster import _retry

    cluster = make_cluster([512 * MiB, 512 * MiB], image_store=image_store)
    template = Template(name=f"group-{uuid.uuid4().hex[:8]}", image="app:latest")
    try:
        c = cluster.controller
        group = [Sandbox.create(c, template, group_id="task-1") for _ in range(3)]
        nodes = {c.routes[s.sandbox_id].node_id for s in group}
        assert len(nodes) == 1
        for i, sandbox in enumerate(group):
            sandbox.files.write("progress.txt", f"step {i}")
            sandbox.run(f"mkdir -p /tmp/w{i} && cd /tmp/w{i} && export STEP={i}")
        cluster.kill_node(nodes.pop())
        for i, sandbox in enumerate(group):
            result = _retry(lambda s=sandbox: s.run("pwd; echo $STEP $GREETING; id -un; cat /home/app/progress.txt"))
            assert result.stdout == f"/tmp/w{i}\n{i} hello-from-image\napp\nstep {i}"
        assert sorted(c.recoveries) == sorted(s.sandbox_id for s in group)
    finally:
        cluster.close()


def test_a_command_retried_after_its_node_died_applies_its_effects_once(image_store):
    """The node agent dies mid-command, after the command's write: recovery restores the
    files as the command found them, so the caller's retry adds one, not two."""
    from tests.sandbox.test_cluster import _retry

    cluster = make_cluster([512 * MiB, 512 * MiB], image_store=image_store)
    try:
        c = cluster.controller
        sandbox = Sandbox(c, c.create(Template(name=f"loss-{uuid.uuid4().hex[:8]}", image="app:latest"),
                                      node_id="node-0"))
        sandbox.files.write("counter", "41\n")
        upper = c.routes[sandbox.sandbox_id].layer + "/upper/home/app/counter"
        first: list[object] = []
        command = "n=$(cat counter); echo $((n + 1)) > counter; touch /tmp/wrote; sleep 600"

        def run_first() -> None:
            try:
                first.append(sandbox.run(command, timeout=700))
            except Exception as err:  # noqa: BLE001 - the node's death is what is expected here
                first.append(err)

        runner = threading.Thread(target=run_first)
        runner.start()
        tmp_marker = c.routes[sandbox.sandbox_id].layer + "/tmp/wrote"
        _wait_for_file(tmp_marker)
        assert Path(upper).read_text() == "42\n"  # the first run's effect is on disk
        cluster.kill_node("node-0")
        runner.join()
        assert type(first[0]).__name__ == "SandboxUnavailable"
        retried = _retry(lambda: sandbox.run(command.replace("sleep 600", "cat counter"), timeout=30))
        assert retried.stdout == "42\n" and sandbox.files.read("counter") == "42\n"
    finally:
        cluster.close()


def _wait_for_file(path: str, timeout_s: float = 30.0) -> None:
    """The command's marker appears on the host side of its layer (inotify-free: polls)."""
    import os
    import time

    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)
