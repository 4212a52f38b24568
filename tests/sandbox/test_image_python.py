"""Image templates with python_* fields: the image's own Python, warmed once per node in
the image zygote, and each sandbox's warm Python forked from it into the sandbox."""

from __future__ import annotations

import inspect
import os
import signal
import uuid
from pathlib import Path

import pytest
from tests.sandbox.cluster_helpers import MiB, make_cluster
from tests.sandbox.test_image_sandbox import PROBES, _ImageSandboxes

from venusrl.sandbox.api import Sandbox
from venusrl.sandbox.errors import SandboxError, TemplateError
from venusrl.sandbox.image.build import ImageSpec, LayerTar, write_oci
from venusrl.sandbox.image.python import find_python
from venusrl.sandbox.image.store import ImageStore
from venusrl.sandbox.template import Template

pytestmark = pytest.mark.needs_root

# Setup records one random stamp per run; start writes, from the sandbox's warm Python,
# which of the template's modules it already had and the stamp it inherited.
SETUP = "import os\nSTAMP = os.urandom(8).hex()\n"
START = ("import sys\nMODULES = sorted(m for m in ('json', 'decimal') if m in sys.modules)\n"
         "open('/tmp/warm', 'w').write(' '.join(MODULES) + ' ' + STAMP + ' ' + str(os.getuid()))\n")


@pytest.fixture(scope="module")
def python_cluster(test_images, tmp_path_factory):
    store = tmp_path_factory.mktemp("image-store")
    ImageStore(store).import_image(test_images.oci_app)
    ImageStore(store).import_image(test_images.oci_other)  # User unset: root
    no_python = tmp_path_factory.mktemp("no-python")
    (no_python / "bin").mkdir()
    (no_python / "bin" / "true").write_text("")
    ImageStore(store).import_image(write_oci(ImageSpec([LayerTar.from_dir(no_python)]),
                                             tmp_path_factory.mktemp("np") / "oci", ref="bare:latest"))
    cluster = make_cluster([1024 * MiB], image_store=str(store))
    yield cluster
    cluster.close()


def _template(image: str = "app:latest", **fields) -> Template:
    return Template(name=f"py-{uuid.uuid4().hex[:8]}", image=image, **fields)


def test_the_images_python_is_found_in_its_files(python_cluster, tmp_path):
    store = ImageStore(python_cluster.config.image_store)
    assert find_python(store, store.get("app:latest")) == "/usr/bin/python3"  # its PATH, through /bin -> usr/bin
    assert find_python(store, store.get("bare:latest")) is None
    versioned = tmp_path / "versioned"
    (versioned / "usr" / "bin").mkdir(parents=True)
    (versioned / "usr" / "bin" / "python3.9").write_text("#!/bin/sh\n")
    (versioned / "usr" / "bin" / "python3.9").chmod(0o755)
    (versioned / "usr" / "bin" / "python3.12").symlink_to("python3.9")
    base = LayerTar.from_dir(versioned)
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    for name, layers in (("versioned", [base]),
                         ("hidden", [base, LayerTar.from_dir(hidden, extra={"usr/bin/.wh.python3.9": b""})])):
        store.import_image(write_oci(ImageSpec(layers, env=["PATH=/opt/none"]), tmp_path / f"{name}-oci"),
                           name=name)
    assert find_python(store, store.get("versioned")) == "/usr/bin/python3.12"  # newest first, symlink followed
    assert find_python(store, store.get("hidden")) is None  # the whiteout removed it (and the link dangles)


def test_sandboxes_start_with_the_imports_and_setup_of_one_zygote(python_cluster):
    template = _template(python_modules=("json", "decimal"), python_setup=SETUP, python_start=START)
    sandboxes = [Sandbox.create(python_cluster.controller, template, group_id="warm") for _ in range(3)]
    try:
        reports = [s.run("cat /tmp/warm").stdout.split() for s in sandboxes]
        assert all(r[:2] == ["decimal", "json"] for r in reports), reports
        assert len({r[2] for r in reports}) == 1  # one setup for the template, not one per sandbox
        assert {r[3] for r in reports} == {"1000"}  # the image's User
        # a command sees the warm Python among its sandbox's processes, running as the image's User
        seen = sandboxes[0].run("ps -eo user=,comm= | grep -c '^app *python3$'")
        assert seen.stdout == "1\n", seen.stdout
    finally:
        for s in sandboxes:
            s.kill()


def test_without_page_sharing_each_sandbox_runs_the_setup_itself(test_images, tmp_path):
    """The control of the test above: with share_pages off the image zygote forks before
    any setup, so every sandbox's warm Python runs it, and the stamps differ."""
    ImageStore(tmp_path / "store").import_image(test_images.oci_app)
    cluster = make_cluster([512 * MiB], image_store=str(tmp_path / "store"), share_pages=False)
    try:
        template = _template(python_modules=("json", "decimal"), python_setup=SETUP, python_start=START)
        sandboxes = [Sandbox.create(cluster.controller, template, group_id="cold") for _ in range(2)]
        reports = [s.run("cat /tmp/warm").stdout.split() for s in sandboxes]
        assert all(r[:2] == ["decimal", "json"] for r in reports), reports
        assert len({r[2] for r in reports}) == 2
    finally:
        cluster.close()


def test_the_zygotes_pages_are_shared_by_its_sandboxes(python_cluster):
    """32 MiB made in the image zygote's setup: mapped in every sandbox's warm Python,
    charged once, to the template's pool, not to each sandbox."""
    template = _template(python_setup="DATA = b'x' * (32 << 20)")
    sandboxes = [Sandbox.create(python_cluster.controller, template, group_id="pages") for _ in range(2)]
    try:
        for sandbox in sandboxes:
            m = sandbox.metrics()
            assert m["rss_bytes"] > 32 * MiB  # the warm Python maps the zygote's pages...
            assert m["uss_bytes"] < 16 * MiB  # ...of which it owns few: they are shared
            assert m["cgroup_bytes"] < 24 * MiB  # ...and charged to the pool
    finally:
        for sandbox in sandboxes:
            sandbox.kill()


def test_bad_python_fields_are_clear_errors(python_cluster):
    bad = {"python_modules need a Python interpreter in image bare:latest":
           _template("bare:latest", python_modules=("json",)),
           "python_setup/python_start need a Python interpreter":
           _template("bare:latest", python_setup="x = 1", python_start="y = 2"),
           "zygote setup failed: template py-[0-9a-f]+: cannot import no_such_module: No module named":
           _template(python_modules=("no_such_module",)),
           "(?s)its Python did not start: .*<template py-[0-9a-f]+ start>.*ZeroDivisionError":
           _template(python_start="1 / 0")}
    for message, template in bad.items():
        with pytest.raises(TemplateError, match=message):
            python_cluster.controller.create(template)
    left = {route.template.name for route in python_cluster.controller.routes.values()}
    assert not left & {template.name for template in bad.values()}  # nothing half-made stays


def test_the_images_root_holds_nothing_over_the_namespaces_its_python_could_join(python_cluster):
    """The sandbox's namespaces belong to the image zygote's user namespace; the sandbox's
    own root (image User unset) is root of a namespace below it, owning none of them."""
    sandbox = Sandbox.create(python_cluster.controller, _template("other:latest", python_modules=("json",)))
    try:
        result = sandbox.run("id -u; mount -t tmpfs none /mnt 2>/dev/null && echo MOUNTED; "
                             "unshare -U true 2>/dev/null && echo UNSHARED; hostname x 2>/dev/null && echo RENAMED; "
                             "ps -eo comm= | grep -c '^python3$'")
        assert result.stdout.split() == ["0", "1"]  # root, none of those, its own warm Python alone
    finally:
        sandbox.kill()


def test_random_state_is_reseeded_in_each_warm_python(python_cluster):
    template = _template(python_modules=("random",), python_setup="random.seed(0)",
                         python_start="open('/tmp/draw', 'w').write(repr(random.random()))")
    a, b = (Sandbox.create(python_cluster.controller, template) for _ in range(2))
    try:
        assert a.files.read("/tmp/draw") != b.files.read("/tmp/draw")
    finally:
        a.kill()
        b.kill()


@pytest.mark.parametrize("probe", PROBES, ids=lambda probe: probe.__name__.removeprefix("test_"))
def test_isolation_probe_is_contained_in_a_sandbox_with_a_warm_python(python_cluster, probe, tmp_path):
    template = _template(python_modules=("json", "decimal"), python_setup=SETUP, python_start=START)
    given = {"cluster": _ImageSandboxes(python_cluster, template), "tmp_path": tmp_path}
    probe(**{name: given[name] for name in inspect.signature(probe).parameters})


def _image_zygotes(template: Template) -> list[int]:
    """Host pids of the template's image zygotes (the image's Python on forkserver.py)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
            cgroups = (entry / "cgroup").read_text()
        except OSError:
            continue
        if args[1:3] == [b"-I", b"-"] and f"/pool-{template.name}-python\n" in cgroups:
            found.append(int(entry.name))
    return found


def test_a_dead_image_zygote_takes_its_sandboxes_down_and_they_restart_from_a_new_one(python_cluster):
    template = _template(python_modules=("json", "decimal"), python_setup=SETUP, python_start=START)
    first = Sandbox.create(python_cluster.controller, template, group_id="dies")
    second = None
    try:
        stamp = first.run("cat /tmp/warm").stdout.split()[2]
        (zygote,) = _image_zygotes(template)
        os.kill(zygote, signal.SIGKILL)  # PID 1 of the zygote's namespace: every sandbox's lies below it
        with pytest.raises(SandboxError, match="init unreachable|init exited"):
            first.run("true")  # its init died with the zygote; the node agent restarts it (callers retry)
        restarted = first.run("cat /tmp/warm").stdout.split()
        assert restarted[:2] == ["decimal", "json"] and restarted[2] != stamp  # a new zygote, set up anew
        second = Sandbox.create(python_cluster.controller, template, group_id="dies")
        assert second.run("cat /tmp/warm").stdout.split()[2] == restarted[2]  # ...and only once
        assert len(_image_zygotes(template)) == 1  # the dead one's pool was closed, not leaked
    finally:
        first.kill()
        if second is not None:
            second.kill()
