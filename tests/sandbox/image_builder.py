"""The images the sandbox image tests share, built at test time from this host's files."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from venusrl.sandbox.image.build import (
    PYTEST_PACKAGES,
    ImageSpec,
    LayerTar,
    host_rootfs,
    write_docker_archive,
    write_oci,
)


@dataclass
class ImageSet:
    """The images the sandbox image tests share: `app` and `other` have the same base layer."""

    base: LayerTar
    app: ImageSpec
    other: ImageSpec
    oci_app: Path  # OCI layout directory of `app`
    docker_app: Path  # docker-archive of the same image
    oci_other: Path


APP_ENV = ["PATH=/usr/local/bin:/usr/bin:/bin", "GREETING=hello-from-image"]


def build_test_images(work: Path) -> ImageSet:
    rootfs = host_rootfs(work / "rootfs", python_packages=PYTEST_PACKAGES)
    (rootfs / "opt" / "gone.txt").write_text("deleted by the app layer\n")
    (rootfs / "opt" / "dir").mkdir()
    for name in ("a", "b"):
        (rootfs / "opt" / "dir" / name).write_text(f"{name} from base\n")
    base = LayerTar.from_dir(rootfs)
    app_dir = work / "app-layer"
    (app_dir / "etc").mkdir(parents=True)
    (app_dir / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n"
                                            "app:x:1000:1000:app:/home/app:/bin/bash\n")
    (app_dir / "etc" / "group").write_text("root:x:0:\napp:x:1000:\nstaff:x:50:app\n")
    (app_dir / "home" / "app").mkdir(parents=True)
    (app_dir / "workspace").mkdir()  # the base sandboxes' probes write there
    (app_dir / "home" / "app" / "notes.txt").write_text("image file\n")
    (app_dir / "opt" / "dir").mkdir(parents=True)
    (app_dir / "opt" / "dir" / "c").write_text("c from app\n")
    app_layer = LayerTar.from_dir(app_dir, owners={"home/app": 1000, "workspace": 1000},
                               extra={"opt/.wh.gone.txt": b"", "opt/dir/.wh..wh..opq": b""})
    app = ImageSpec([base, app_layer], env=APP_ENV, working_dir="/home/app", user="app", cmd=["/bin/bash"])
    other_dir = work / "other-layer"
    (other_dir / "srv").mkdir(parents=True)
    (other_dir / "srv" / "other.txt").write_text("other image\n")
    other = ImageSpec([base, LayerTar.from_dir(other_dir)], env=APP_ENV, working_dir="/srv")
    return ImageSet(base, app, other, write_oci(app, work / "app-oci", ref="app:latest"),
                      write_docker_archive(app, work / "app-docker.tar", tag="test/app:latest"),
                      write_oci(other, work / "other-oci", ref="other:latest"))
