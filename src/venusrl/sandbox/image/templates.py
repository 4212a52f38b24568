"""Node side of image templates: resolve a template's image in the store once per pool,
write the template's own layer over it, and say how its sandboxes start.

A template names an image (`Template.image`); its `files` and `directory` land in the
image's WorkingDir, in a layer of the template's own that sits above the image's layers
(read-only and shared like them), owned by the image's User; then its `setup_commands`
run once as the image's root with that layer as their writable layer (setup.py).
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from venusrl.sandbox.errors import TemplateError
from venusrl.sandbox.image.config import session_environment
from venusrl.sandbox.image.layers import UID_BASE
from venusrl.sandbox.image.python import find_python, image_path
from venusrl.sandbox.image.rootfs import ImageRoot
from venusrl.sandbox.image.setup import run_setup
from venusrl.sandbox.image.store import ImageStore, ImageUse
from venusrl.sandbox.template import Template

WORKSPACE_DEFAULTS: dict[str, Any] = {"cwd": "/workspace", "env": {}}
IMAGE_COMMAND_LOG = "/tmp/image-command.log"


@dataclass(frozen=True)
class PreparedImage:
    root: ImageRoot
    session: dict[str, Any]  # where and with what environment commands start
    command: tuple[str, ...]  # Entrypoint + Cmd
    python: str | None  # the image's interpreter, when the template has python_* fields


def image_template(image: str) -> Template:
    """One template per image: a readable name plus a hash, so distinct images never collide."""
    slug = re.sub(r"[^A-Za-z0-9_.-]", "-", image)[:40].strip("-.") or "image"
    return Template(name=f"img-{slug}-{hashlib.sha256(image.encode()).hexdigest()[:8]}", image=image)


class ImageTemplates:
    def __init__(self, store: str | Path, holder: str = "a node") -> None:
        """`holder` names this node in the store's record of who uses an image."""
        self.store = ImageStore(store)
        self.holder = holder
        self._prepared: dict[str, PreparedImage] = {}
        self._uses: dict[str, ImageUse] = {}  # template -> its hold on its image, while its pool lives
        self._lock = threading.Lock()

    def materialize(self, template: Template, layer: Path) -> None:
        """Write the template's layer (and, for an image template, resolve its image)."""
        if template.image is None:
            template.materialize(layer)
            return
        self.release(template)
        use = self.store.use(template.image, f"template {template.name} on {self.holder}")
        with self._lock:
            self._uses[template.name] = use
        record = self.store.get(template.image)
        user = self.store.resolve_user(record)
        if layer.exists():
            shutil.rmtree(layer)
        target = layer / record.working_dir.lstrip("/")
        if template.directory:
            if not Path(template.directory).is_dir():
                raise TemplateError(f"template {template.name}: directory {template.directory} does not exist")
            shutil.copytree(template.directory, target, symlinks=True, dirs_exist_ok=True)
        target.mkdir(parents=True, exist_ok=True)
        for rel, text in template.files.items():
            path = target / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        for path in layer.rglob("*"):
            os.lchown(path, UID_BASE + user.uid, UID_BASE + user.gid)
        # Directories above the WorkingDir only carry it: they take the image's owners.
        for parent in target.relative_to(layer).parents:
            os.lchown(layer / parent, UID_BASE, UID_BASE)
        os.lchown(target, UID_BASE + user.uid, UID_BASE + user.gid)
        environment = session_environment(record, user)
        python = None
        if template.python_modules or template.python_setup or template.python_start:
            python = find_python(self.store, record)
            if python is None:
                fields = [f for f in ("python_modules", "python_setup", "python_start") if getattr(template, f)]
                raise TemplateError(
                    f"template {template.name}: {'/'.join(fields)} need a Python interpreter in image "
                    f"{template.image}, and it has none (looked in its PATH {':'.join(image_path(record))} "
                    f"and for /usr/local/bin/python3.*, /usr/bin/python3.*)")
        if template.setup_commands:
            image_only = ImageRoot(record.name, str(self.store.layers_dir), self.store.lower_dirs(record),
                                   0, 0, record.working_dir)
            run_setup(template.name, image_only, layer, template.setup_commands,
                      {**environment, "HOME": "/root", "USER": "root"})
        root = ImageRoot(record.name, str(self.store.layers_dir), (str(layer), *self.store.lower_dirs(record)),
                         user.uid, user.gid, record.working_dir)
        with self._lock:
            self._prepared[template.name] = PreparedImage(root, {"cwd": record.working_dir, "env": environment},
                                                          record.command, python)

    def release(self, template: Template) -> None:
        """Let go of the template's image (its pool is gone)."""
        with self._lock:
            use = self._uses.pop(template.name, None)
        if use is not None:
            use.release()

    def root(self, template: Template) -> dict[str, Any] | None:
        """The SandboxSpec's `image` field: None for a template without an image."""
        if template.image is None:
            return None
        with self._lock:
            return self._prepared[template.name].root.to_json()

    def image_zygote(self, template: Template, scratch: Path) -> dict[str, Any] | None:
        """The image zygote's job (image/zygote.py), when the template's Python runs in the
        image: its root is the template's, over a private upper under `scratch`."""
        if template.image is None:
            return None
        with self._lock:
            prepared = self._prepared[template.name]
        if prepared.python is None:
            return None
        shutil.rmtree(scratch, ignore_errors=True)
        for name in ("root", "upper", "work", "tmp"):
            (scratch / name).mkdir(parents=True)
        os.chmod(scratch / "tmp", 0o1777)
        return {"image": prepared.root.to_json(), "python": prepared.python, "env": prepared.session["env"],
                **{name: str(scratch / name) for name in ("root", "upper", "work", "tmp")}}

    def session_defaults(self, template: Template) -> dict[str, Any]:
        if template.image is None:
            return WORKSPACE_DEFAULTS
        with self._lock:
            return self._prepared[template.name].session

    def start_command(self, template: Template) -> str | None:
        """The shell line that starts the image's Entrypoint+Cmd in the background, when
        the template asks for it and the image has one."""
        if template.image is None or not template.image_command:
            return None
        with self._lock:
            command = self._prepared[template.name].command
        if not command:
            raise TemplateError(f"template {template.name}: image_command is set but image {template.image} "
                                "has no Entrypoint or Cmd")
        return f"{shlex.join(command)} </dev/null >{IMAGE_COMMAND_LOG} 2>&1 &"  # bash sends no SIGHUP on exit
