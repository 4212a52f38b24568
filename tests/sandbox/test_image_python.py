"""Image templates with python_* fields: the image's own Python, warmed once per node in
the image zygote, and each sandbox's warm Python forked from it into the sandbox."""

from __future__ import annotations

import uuid

import pytest
from tests.sandbox.cluster_helpers import MiB, make_cluster

from venusrl.sandbox.api import Sandbox
from venusrl.sandbox.errors import TemplateError
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


def test_the_images_python_is_found_in_its_files(python_cluster):
    store = ImageStore(python_cluster.config.image_store)
    assert find_python(store, store.get("app:latest")) == "/usr/local/bin/python3" or \
        find_python(store, store.get("app:latest")).endswith("python3")
    assert find_python(store, store.get("bare:latest")) is None


def test_sandboxes_start_with_the_imports_and_setup_of_one_zygote(python_cluster):
    template = _template(python_modules=("json", "decimal"), python_setup=SETUP, python_start=START)
    sandboxes = [Sandbox.create(python_cluster.controller, template, group_id="warm") for _ in range(3)]
    try:
        reports = [s.run("cat /tmp/warm").stdout.split() for s in sandboxes]
        assert all(r[:2] == ["decimal", "json"] for r in reports), reports
        assert len({r[2] for r in reports}) == 1  # one setup for the template, not one per sandbox
        assert {r[3] for r in reports} == {"1000"}  # the image's User
    finally:
        for s in sandboxes:
            s.kill()


def test_an_image_without_python_names_the_field(python_cluster):
    with pytest.raises(TemplateError, match="python_modules need a Python interpreter in image bare:latest"):
        python_cluster.controller.create(_template("bare:latest", python_modules=("json",)))
