"""Sandboxes whose root is an imported image: the image's Env/WorkingDir/User, private
writes over shared layers, and the isolation probes of base sandboxes."""

from __future__ import annotations

import inspect
import os
import uuid
from pathlib import Path

import pytest
from tests.sandbox import test_isolation as probes
from tests.sandbox.cluster_helpers import MiB, make_cluster

from venusrl.sandbox.api import Sandbox
from venusrl.sandbox.errors import InvalidRequest, TemplateError
from venusrl.sandbox.image.build import ImageSpec, write_docker_archive
from venusrl.sandbox.image.formats import ImageError
from venusrl.sandbox.image.layers import UID_BASE
from venusrl.sandbox.image.store import ImageStore
from venusrl.sandbox.template import Template


@pytest.fixture(scope="module")
def image_cluster(test_images, tmp_path_factory):
    store = tmp_path_factory.mktemp("image-store")
    ImageStore(store).import_image(test_images.oci_app)
    ImageStore(store).import_image(test_images.docker_app, name="app-docker")
    ImageStore(store).import_image(test_images.oci_other)
    cluster = make_cluster([1024 * MiB, 1024 * MiB], image_store=str(store))
    yield cluster
    cluster.close()


def _template(image: str, **fields) -> Template:
    return Template(name=f"img-{uuid.uuid4().hex[:8]}", image=image, **fields)


@pytest.mark.parametrize("image", ["app:latest", "app-docker"])
def test_command_runs_under_the_images_env_workdir_and_user(image_cluster, image):
    sandbox = Sandbox.create(image_cluster.controller, _template(image))
    try:
        result = sandbox.run("pwd; id -u; id -g; id -un; echo $GREETING $HOME; cat notes.txt; ls /opt/dir; "
                             "ls /opt; test -e /opt/gone.txt || echo gone-is-gone")
        assert result.exit_code == 0, result.stderr
        assert result.stdout.splitlines() == ["/home/app", "1000", "1000", "app", "hello-from-image /home/app",
                                              "image file", "c", "dir", "gone-is-gone"]
        assert sandbox.files.read("notes.txt") == "image file\n"  # relative to WorkingDir
    finally:
        sandbox.kill()


def test_writes_are_private_and_the_shared_layers_never_change(image_cluster):
    template = _template("app:latest")
    a = Sandbox.create(image_cluster.controller, template)
    b = Sandbox.create(image_cluster.controller, template)
    try:
        assert a.run("echo changed > notes.txt && echo mine > /home/app/new && rm /opt/dir/c").exit_code != 0
        assert a.run("cat notes.txt new; ls /opt/dir").stdout == "changed\nmine\nc\n"  # app may not delete root's
        assert b.run("cat notes.txt; ls").stdout == "image file\nnotes.txt\n"
        store = ImageStore(image_cluster.config.image_store)
        assert store.read_file(store.get("app:latest"), "/home/app/notes.txt") == "image file\n"
        upper = image_cluster.controller.routes[a.sandbox_id].layer + "/upper"
        assert Path(f"{upper}/home/app/notes.txt").read_text() == "changed\n"
        assert os.stat(f"{upper}/home/app/new").st_uid == UID_BASE + 1000
    finally:
        a.kill()
        b.kill()


def test_image_root_user_is_root_of_nothing_on_the_host(image_cluster, tmp_path):
    sandbox = Sandbox.create(image_cluster.controller, _template("other:latest"))  # User unset: root
    try:
        result = sandbox.run("id -u; pwd; cat other.txt; echo x > /etc/new && rm /opt/dir/a && echo ROOT-WRITES-IMAGE; "
                             "mount -t tmpfs none /mnt 2>/dev/null && echo MOUNTED; "
                             "echo 1 > /proc/sys/kernel/hostname 2>/dev/null && echo SYSCTL; "
                             "ls /proc/1/root/ >/dev/null 2>&1; cat /proc/1/environ >/dev/null 2>&1 && echo INIT")
        lines = result.stdout.splitlines()
        assert lines[:4] == ["0", "/srv", "other image", "ROOT-WRITES-IMAGE"]
        assert "MOUNTED" not in lines and "SYSCTL" not in lines
        assert not os.path.exists("/etc/new")
    finally:
        sandbox.kill()


def test_template_files_land_in_the_working_dir(image_cluster):
    sandbox = Sandbox.create(image_cluster.controller, _template("app:latest", files={"task/README": "do it\n"}))
    try:
        assert sandbox.run("cat task/README; stat -c %u task/README").stdout == "do it\n1000\n"
    finally:
        sandbox.kill()


def test_unknown_image_and_failing_setup_are_clear_errors(image_cluster):
    with pytest.raises(InvalidRequest, match="no image 'missing'"):
        image_cluster.controller.create(_template("missing"))
    with pytest.raises(TemplateError, match="setup command 'false' exited 1"):
        image_cluster.controller.create(_template("app:latest", setup_commands=("false",)))


def test_setup_commands_run_once_into_the_templates_layer(image_cluster):
    template = _template("app:latest", files={"data.txt": "from files\n"}, setup_commands=(
        "id -u > /etc/setup-uid && cat data.txt > /opt/copied && rm /opt/dir/c && cat /proc/sys/kernel/random/uuid > /opt/stamp",
        "test ! -e /proc/1/root/work && echo no-host > /opt/isolated"))
    a = Sandbox.create(image_cluster.controller, template, group_id="setup")
    b = Sandbox.create(image_cluster.controller, template, group_id="setup")  # same node, same pool
    try:
        probe = "cat /etc/setup-uid /opt/copied /opt/isolated; ls /opt/dir | wc -l; cat /opt/stamp"
        first, second = a.run(probe), b.run(probe)
        assert first.stdout.splitlines()[:4] == ["0", "from files", "no-host", "0"]
        assert first.stdout == second.stdout  # the setup ran once for the node, not per sandbox
        assert a.run("echo x > /etc/setup-uid").exit_code != 0  # root's file; the sandbox runs as app
    finally:
        a.kill()
        b.kill()


# The isolation probes of test_isolation.py, unchanged, against image sandboxes -----------------

class _ImageSandboxes:
    """A cluster whose default template is an image template: the probes' `Sandbox.create(
    cluster.controller)` then makes an image sandbox, everything else is the real cluster."""

    def __init__(self, cluster, template: Template) -> None:
        self._cluster, self.controller = cluster, _ImageController(cluster.controller, template)

    def __getattr__(self, name):
        return getattr(self._cluster, name)


class _ImageController:
    def __init__(self, controller, template: Template) -> None:
        self._controller, self._template = controller, template

    def create(self, template="base", **fields):
        return self._controller.create(self._template if template == "base" else template, **fields)

    def __getattr__(self, name):
        return getattr(self._controller, name)


PROBES = [probes.test_no_network, probes.test_cannot_see_or_signal_host_or_other_sandboxes,
          probes.test_cannot_write_outside_its_layer, probes.test_cannot_read_another_sandboxs_files,
          probes.test_fork_bomb_stops_at_pids_limit, probes.test_memory_bomb_stops_at_limit_without_harming_neighbours,
          probes.test_timeout_kills_whole_process_tree, probes.test_kernel_surface_outside_the_box_is_denied]


@pytest.mark.parametrize("probe", PROBES, ids=lambda probe: probe.__name__.removeprefix("test_"))
def test_isolation_probe_is_contained_in_an_image_sandbox(image_cluster, probe, tmp_path):
    cluster = _ImageSandboxes(image_cluster, _template("app:latest"))
    given = {"cluster": cluster, "tmp_path": tmp_path}
    probe(**{name: given[name] for name in inspect.signature(probe).parameters})


def test_image_sandbox_sees_no_host_path_not_even_the_store(image_cluster, tmp_path):
    marker = tmp_path / "marker"
    marker.write_text("host")
    sandbox = Sandbox.create(image_cluster.controller, _template("app:latest"))
    try:
        paths = [str(marker), "/work", "/root/.pyenv", image_cluster.config.image_store, str(image_cluster.workdir)]
        result = sandbox.run("; ".join(f"ls {p} >/dev/null 2>&1 && echo SEES {p}" for p in paths)
                             + f"; echo x > {marker} 2>/dev/null && echo WROTE; ls /", timeout=10)
        assert "SEES" not in result.stdout and "WROTE" not in result.stdout
        assert marker.read_text() == "host"
    finally:
        sandbox.kill()


def test_image_command_starts_in_every_sandbox_when_asked(image_cluster, test_images, tmp_path):
    service = ImageSpec([test_images.base], env=["GREETING=service"], working_dir="/srv",
                        entrypoint=["/bin/bash", "-c"], cmd=["echo started $GREETING in $PWD > /tmp/marker; sleep 600"])
    ImageStore(image_cluster.config.image_store).import_image(write_docker_archive(service, tmp_path / "svc.tar"),
                                                              name="service")
    on = Sandbox.create(image_cluster.controller, _template("service", image_command=True))
    off = Sandbox.create(image_cluster.controller, _template("service"))
    try:
        wait = "for i in $(seq 200); do test -s /tmp/marker && break; sleep 0.05; done; cat /tmp/marker; "
        assert on.run(wait + "ps -eo args | grep -c '^sleep 600'").stdout == "started service in /srv\n1\n"
        assert off.run("cat /tmp/marker 2>/dev/null; ps -eo args | grep -c '^sleep 600'").stdout == "0\n"
    finally:
        on.kill()
        off.kill()
    with pytest.raises(TemplateError, match="has no Entrypoint or Cmd"):
        image_cluster.controller.create(_template("other:latest", image_command=True))


def test_cli_exec_runs_a_command_in_an_image(image_cluster, tmp_path):
    from typer.testing import CliRunner

    from venusrl.cli import app

    config = tmp_path / "config.yaml"
    config.write_text(f"sandbox:\n  image_store: {image_cluster.config.image_store}\n")
    done = CliRunner().invoke(app, ["sandbox", "exec", "--config", str(config), "--image", "app:latest", "--",
                                    "bash", "-c", "id -un; pwd; exit 3"])
    assert done.exit_code == 3 and done.stdout == "app\n/home/app\n"


def test_two_templates_share_the_base_layers_files_and_their_page_cache(image_cluster):
    """Sandboxes of `app` and `other` read the very inode the store holds once: one copy on
    disk, one page cache, whatever the number of images, templates and sandboxes."""
    store = ImageStore(image_cluster.config.image_store)
    bash = os.path.realpath(store.layer_path(store.get("app:latest").layers[0]) / "usr" / "bin" / "bash")
    a = Sandbox.create(image_cluster.controller, _template("app:latest"))
    b = Sandbox.create(image_cluster.controller, _template("other:latest"))
    try:
        inodes = {s.run("stat -L -c %i /bin/bash").stdout.strip() for s in (a, b)}
        assert inodes == {str(os.stat(bash).st_ino)}
    finally:
        a.kill()
        b.kill()


def test_image_sandbox_writes_stop_at_its_disk_quota(image_cluster):
    """The private upper of an image root sits on the sandbox's quota filesystem, as a base
    sandbox's workspace does: a full quota is ENOSPC inside and the next command still runs."""
    sandbox = Sandbox.create(image_cluster.controller, _template("app:latest", disk_quota="24MiB"))
    try:
        filled = sandbox.run("dd if=/dev/zero of=big bs=1M count=200 2>&1; dd if=/dev/zero of=/tmp/big bs=1M count=200 2>&1",
                             timeout=60)
        assert filled.stdout.count("No space left on device") == 2
        assert sandbox.run("rm -f big /tmp/big && cat notes.txt").stdout == "image file\n"
    finally:
        sandbox.kill()


def test_image_rm_is_refused_while_a_template_pool_uses_it(test_images, tmp_path):
    from typer.testing import CliRunner

    from venusrl.cli import app

    store = ImageStore(tmp_path / "store")
    store.import_image(test_images.oci_other)
    cluster = make_cluster([512 * MiB], image_store=str(store.root))
    try:
        template = _template("other:latest")
        sandbox = Sandbox.create(cluster.controller, template)
        in_use = rf"image other:latest: in use by template {template.name} on node node-0 \(workdir .*\) \(pid \d+\)"
        with pytest.raises(ImageError, match=in_use):
            store.remove("other:latest")
        sandbox.kill()
        done = CliRunner().invoke(app, ["sandbox", "image", "rm", "--store", str(store.root), "other:latest"])
        assert done.exit_code == 2 and "in use by template" in done.output  # its pool still holds it
        assert store.get("other:latest").layers  # nothing was deleted
    finally:
        cluster.close()
    assert store.users("other:latest") == []
    assert store.remove("other:latest") == 2  # once the node is gone, the image and both its layers go


def test_a_holder_that_died_leaves_no_use_behind(test_images, tmp_path):
    from tests.sandbox.forked import in_child

    store = ImageStore(tmp_path / "store")
    store.import_image(test_images.oci_other)
    in_child(lambda: {"path": str(store.use("other:latest", "a node that crashes").path)})  # never released
    assert len(list((store.root / "uses").rglob("*-*"))) == 1
    assert store.users("other:latest") == []  # its lock went with it, and the record with that
    assert not list((store.root / "uses").rglob("*-*"))
    assert store.remove("other:latest") == 2


def test_an_imported_images_name_is_an_e2b_template_id(image_cluster):
    e2b = pytest.importorskip("e2b", reason="the e2b SDK is in the dev extra")
    from venusrl.sandbox.e2b.app import E2BServer
    from venusrl.sandbox.e2b.service import E2BService

    service = E2BService(image_cluster.controller, "e2b_test_key", image_cluster.config.image_store)
    with E2BServer(service) as server, server.sdk_environment(), e2b.Sandbox.create("app-docker") as sandbox:
        result = sandbox.commands.run("id -un; echo $GREETING; cat notes.txt")
        assert result.stdout.splitlines() == ["app", "hello-from-image", "image file"]
        assert sandbox.files.read("/home/app/notes.txt") == "image file\n"
