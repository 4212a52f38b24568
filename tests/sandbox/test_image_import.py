"""Importing images into the layer store: both packagings, sharing, whiteouts, bad input."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import stat
import subprocess
import tarfile

import pytest

from venusrl.sandbox.image.build import ImageSpec, LayerTar, write_docker_archive, write_oci
from venusrl.sandbox.image.formats import ImageError
from venusrl.sandbox.image.layers import OPAQUE_XATTR, UID_BASE
from venusrl.sandbox.image.store import ImageStore


def test_oci_and_docker_archive_import_to_the_same_image_and_layers(test_images, tmp_path):
    store = ImageStore(tmp_path / "store")
    oci = store.import_image(test_images.oci_app)
    assert (oci.record.name, oci.record.format, oci.new_layers, oci.shared_layers) == ("app:latest", "oci", 2, 0)
    docker = store.import_image(test_images.docker_app, name="app-docker")
    assert (docker.record.format, docker.new_layers, docker.shared_layers) == ("docker-archive", 0, 2)
    assert docker.record.image_id == oci.record.image_id
    assert docker.record.layers == oci.record.layers
    record = store.get("app-docker")
    assert record.env == ("PATH=/usr/local/bin:/usr/bin:/bin", "GREETING=hello-from-image")
    assert (record.working_dir, record.user, record.command) == ("/home/app", "app", ("/bin/bash",))
    user = store.resolve_user(record)
    assert (user.uid, user.gid, user.name, user.home) == (1000, 1000, "app", "/home/app")


def test_two_images_sharing_a_base_layer_store_it_once(test_images, tmp_path):
    store = ImageStore(tmp_path / "store")
    first = store.import_image(test_images.oci_app)
    second = store.import_image(test_images.oci_other)
    assert (second.new_layers, second.shared_layers) == (1, 1)
    assert first.record.layers[0] == second.record.layers[0] == test_images.base.diff_id
    assert len(list(store.layers_dir.glob("*.json"))) == 3  # base once, plus one top layer each
    assert {r.name for r in store.images()} == {"app:latest", "other:latest"}


def test_whiteouts_become_overlayfs_whiteouts_and_owners_are_shifted(test_images, tmp_path):
    store = ImageStore(tmp_path / "store")
    record = store.import_image(test_images.oci_app).record
    top = store.layer_path(record.layers[1])
    gone = os.lstat(top / "opt" / "gone.txt")
    assert stat.S_ISCHR(gone.st_mode) and gone.st_rdev == os.makedev(0, 0)
    assert os.getxattr(top / "opt" / "dir", OPAQUE_XATTR) == b"y"
    assert not (top / "opt" / ".wh.gone.txt").exists()
    assert os.lstat(top / "home" / "app" / "notes.txt").st_uid == UID_BASE + 1000
    assert os.lstat(store.layer_path(record.layers[0]) / "usr" / "bin").st_uid == UID_BASE
    assert store.read_file(record, "/opt/gone.txt") is None  # whited out
    assert store.read_file(record, "/opt/dir/a") is None  # hidden by the opaque directory
    assert store.read_file(record, "/opt/dir/c") == "c from app\n"
    assert store.read_file(record, "/etc/passwd").count("\n") == 2  # the app layer's, over the base's


def _tar(entries: list[tuple[tarfile.TarInfo, bytes]]) -> LayerTar:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for info, data in entries:
            info.size = len(data) if info.isreg() else 0
            tar.addfile(info, io.BytesIO(data))
    raw = buffer.getvalue()
    return LayerTar(raw, "sha256:" + hashlib.sha256(raw).hexdigest())


def _entry(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info


@pytest.mark.parametrize("entries, message", [
    ([(_entry("../escape"), b"x")], "leaves the layer"),
    ([(_entry("etc", tarfile.SYMTYPE, "/etc"), b""), (_entry("etc/passwd"), b"x")], "through a symlink"),
    ([(_entry("hard", tarfile.LNKTYPE, "../../etc/shadow"), b"")], "leaves the layer"),
])
def test_hostile_layers_are_refused_and_leave_no_layer(tmp_path, entries, message):
    image = ImageSpec([_tar(entries)])
    store = ImageStore(tmp_path / "store")
    with pytest.raises(ImageError, match=message):
        store.import_image(write_oci(image, tmp_path / "bad"))
    assert not list(store.layers_dir.iterdir())
    assert not list((store.root / "tmp").iterdir())
    assert not os.path.exists("/etc/passwd.x") and not (tmp_path / "escape").exists()


def test_bad_files_get_errors_that_name_the_problem(test_images, tmp_path):
    store = ImageStore(tmp_path / "store")
    with pytest.raises(ImageError, match="no such file"):
        store.import_image(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ImageError, match="neither an OCI image layout"):
        store.import_image(tmp_path / "empty")
    corrupt = tmp_path / "corrupt"
    shutil.copytree(test_images.oci_app, corrupt)
    config_digest = json.loads((corrupt / "index.json").read_text())["manifests"][0]["digest"]
    manifest = json.loads((corrupt / "blobs" / "sha256" / config_digest.split(":")[1]).read_text())
    blob = corrupt / "blobs" / "sha256" / manifest["layers"][1]["digest"].split(":")[1]
    blob.write_bytes(blob.read_bytes()[:-8] + b"\0" * 8)
    with pytest.raises(ImageError, match="layer"):
        store.import_image(corrupt)
    with pytest.raises(ImageError, match="no image named 'nope'"):
        store.import_image(test_images.oci_app, ref="nope")
    with pytest.raises(ImageError, match="no image 'absent'.*import it"):
        store.get("absent")
    no_user = ImageSpec(test_images.other.layers, user="ghost")
    with pytest.raises(ImageError, match="User 'ghost'"):
        store.import_image(write_docker_archive(no_user, tmp_path / "ghost.tar"))


@pytest.mark.skipif(shutil.which("umoci") is None, reason="umoci is installed by `make system-deps`")
def test_an_image_built_by_umoci_imports(tmp_path):
    layout = tmp_path / "umoci"
    files = tmp_path / "files"
    (files / "srv").mkdir(parents=True)
    (files / "srv" / "hello.txt").write_text("from umoci\n")
    for args in (["init", "--layout", str(layout)], ["new", "--image", f"{layout}:v1"],
                 ["insert", "--image", f"{layout}:v1", str(files / "srv"), "/srv"],
                 ["config", "--image", f"{layout}:v1", "--config.workingdir", "/srv", "--config.env", "A=1"]):
        subprocess.run(["umoci", *args], check=True, capture_output=True)
    store = ImageStore(tmp_path / "store")
    record = store.import_image(layout).record
    assert (record.name, record.working_dir, record.env) == ("v1", "/srv", ("A=1",))
    assert store.read_file(record, "/srv/hello.txt") == "from umoci\n"


def test_cli_imports_and_lists(test_images, tmp_path):
    from typer.testing import CliRunner

    from venusrl.cli import app

    runner = CliRunner()
    store = str(tmp_path / "store")
    done = runner.invoke(app, ["sandbox", "image", "import", str(test_images.docker_app), "--name", "cli-app",
                               "--store", store])
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout[done.stdout.index("{"):])["new_layers"] == 2
    assert "cli-app" in runner.invoke(app, ["sandbox", "image", "ls", "--store", store]).stdout
    bad = runner.invoke(app, ["sandbox", "image", "import", str(tmp_path / "nothing"), "--store", store])
    assert bad.exit_code == 2 and "no such file" in bad.output


def test_an_oci_layout_packed_in_a_tar_and_a_docker_25_save_import(test_images, tmp_path):
    """`skopeo copy ... oci-archive:` and `docker save` since Docker 25 (an OCI layout plus a
    manifest.json whose Layers point into blobs/) are tarballs of the same files."""
    oci_tar = tmp_path / "app-oci.tar"
    with tarfile.open(oci_tar, "w") as tar:
        tar.add(test_images.oci_app, arcname=".")
    docker25 = tmp_path / "app-docker25.tar"
    index = json.loads((test_images.oci_app / "index.json").read_text())
    manifest = json.loads((test_images.oci_app / "blobs" / "sha256" / index["manifests"][0]["digest"][7:]).read_text())
    with tarfile.open(docker25, "w") as tar:
        tar.add(test_images.oci_app, arcname=".")
        entry = [{"Config": f"blobs/sha256/{manifest['config']['digest'][7:]}", "RepoTags": ["app:25"],
                  "Layers": [f"blobs/sha256/{layer['digest'][7:]}" for layer in manifest["layers"]]}]
        raw = json.dumps(entry).encode()
        info = tarfile.TarInfo("manifest.json")
        info.size = len(raw)
        tar.addfile(info, io.BytesIO(raw))
    store = ImageStore(tmp_path / "store")
    first = store.import_image(oci_tar, name="from-oci-tar")
    second = store.import_image(docker25)
    assert (first.record.format, second.record.format, second.record.name) == ("oci", "docker-archive", "app:25")
    assert first.record.image_id == second.record.image_id and second.new_layers == 0


def test_removing_an_image_keeps_the_layers_another_image_shares(test_images, tmp_path):
    store = ImageStore(tmp_path / "store")
    store.import_image(test_images.oci_app)
    store.import_image(test_images.oci_other)
    assert store.remove("app:latest") == 1  # its own top layer; the base stays for `other`
    assert store.get("other:latest").layers[0] == test_images.base.diff_id
    assert store.has_layer(test_images.base.diff_id)
    assert store.remove("other:latest") == 2
    assert not list(store.layers_dir.iterdir()) and store.images() == []
    with pytest.raises(ImageError, match="no image 'other:latest'"):
        store.remove("other:latest")


def test_a_pinned_image_name_refuses_a_different_image(test_images, tmp_path):
    store = ImageStore(tmp_path / "store")
    record = store.import_image(test_images.oci_app, name="app").record
    assert store.get(f"app@{record.image_id[:19]}") == record
    store.import_image(test_images.oci_other, name="app")  # re-imported under the same name
    with pytest.raises(ImageError, match="not the pinned"):
        store.get(f"app@{record.image_id}")


def test_a_whiteout_never_hides_an_entry_of_its_own_layer(tmp_path):
    layer = _tar([(_entry("keep"), b"mine"), (_entry(".wh.keep"), b""), (_entry(".wh.lower"), b"")])
    store = ImageStore(tmp_path / "store")
    record = store.import_image(write_oci(ImageSpec([layer]), tmp_path / "oci")).record
    top = store.layer_path(record.layers[0])
    assert (top / "keep").read_bytes() == b"mine"
    assert stat.S_ISCHR(os.lstat(top / "lower").st_mode)


@pytest.mark.skipif(shutil.which("zstd") is None, reason="zstd is installed by `make system-deps`")
def test_zstd_layers_import_and_share_with_the_gzip_ones(test_images, tmp_path):
    """A layer is stored by its uncompressed digest: zstd, gzip or plain, it is one layer."""
    store = ImageStore(tmp_path / "store")
    store.import_image(test_images.oci_app)
    layout = shutil.copytree(test_images.oci_other, tmp_path / "zstd")
    blobs = layout / "blobs" / "sha256"
    index = json.loads((layout / "index.json").read_text())
    manifest_path = blobs / index["manifests"][0]["digest"][7:]
    manifest = json.loads(manifest_path.read_text())
    for layer, tar in zip(manifest["layers"], test_images.other.layers, strict=True):
        raw = subprocess.run(["zstd", "-q", "-c"], input=tar.tar, capture_output=True, check=True).stdout
        digest = hashlib.sha256(raw).hexdigest()
        (blobs / digest).write_bytes(raw)
        layer.update(mediaType="application/vnd.oci.image.layer.v1.tar+zstd", digest=f"sha256:{digest}", size=len(raw))
    raw_manifest = json.dumps(manifest).encode()
    digest = hashlib.sha256(raw_manifest).hexdigest()
    (blobs / digest).write_bytes(raw_manifest)
    index["manifests"][0].update(digest=f"sha256:{digest}", size=len(raw_manifest))
    (layout / "index.json").write_text(json.dumps(index))
    result = store.import_image(layout)
    assert (result.new_layers, result.shared_layers) == (1, 1)  # the base came gzipped before
    assert store.read_file(result.record, "/srv/other.txt") == "other image\n"
