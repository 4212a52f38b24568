"""Sandbox templates: a name plus the setup every sandbox of it starts from.

The setup runs once per node in the template's zygote when page sharing is on, and in
every sandbox after it forks when it is off; either way each sandbox starts from the same
state. Templates are trusted configuration: `setup_commands` run as root on the node
(for an image template: as the image's root, in a throwaway sandbox). An image template's
python_* fields run in the image's own interpreter, in its image zygote (image/zygote.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path, PurePosixPath

from pydantic import BaseModel, ByteSize, ConfigDict, Field, field_validator

from venusrl.sandbox import forkserver
from venusrl.sandbox.errors import TemplateError
from venusrl.sandbox.spec import SANDBOX_UID


class Template(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    image: str | None = Field(None, description="an imported image (`venusrl sandbox image import`): the sandbox's root")
    image_command: bool = Field(False, description="start the image's Entrypoint+Cmd in the background in every "
                                "sandbox, as `docker run` would (output in /tmp/image-command.log)")
    python_modules: tuple[str, ...] = Field((), description="imported once by the template (an image template: "
                                            "by the image's own Python, which the image must have)")
    files: dict[str, str] = Field(default_factory=dict, description="workspace (image: WorkingDir) path -> text")
    directory: str | None = Field(None, description="host directory copied into the workspace")
    setup_commands: tuple[str, ...] = Field((), description="shell commands run in the workspace")
    python_setup: str = Field("", description="Python run once by the template; its globals persist")
    python_start: str = Field("", description="Python run in every sandbox right after it starts")
    disk_quota: ByteSize = Field(ByteSize(1 << 30), ge=4 << 20,
                                 description="bytes each sandbox may write (workspace changes and /tmp), e.g. 2GiB")
    inode_quota: int = Field(65536, ge=64, description="files and directories each sandbox may create")

    @field_validator("files")
    @classmethod
    def _relative_paths(cls, files: dict[str, str]) -> dict[str, str]:
        for path in files:
            parts = PurePosixPath(path).parts
            if not parts or PurePosixPath(path).is_absolute() or ".." in parts:
                raise ValueError(f"files: {path!r} must be a relative path inside the workspace")
        return files

    def materialize(self, lower: Path) -> None:
        """Write the template's read-only workspace layer and run its setup commands there."""
        if lower.exists():
            shutil.rmtree(lower)
        if self.directory:
            source = Path(self.directory)
            if not source.is_dir():
                raise TemplateError(f"template {self.name}: directory {source} does not exist")
            shutil.copytree(source, lower, symlinks=True)
        lower.mkdir(parents=True, exist_ok=True)
        for rel, text in self.files.items():
            target = lower / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        for command in self.setup_commands:
            done = subprocess.run(["/bin/sh", "-c", command], cwd=lower, capture_output=True, text=True, timeout=600)
            if done.returncode != 0:
                raise TemplateError(
                    f"template {self.name}: setup command {command!r} exited {done.returncode}: {done.stderr.strip()[-500:]}"
                )
        # Layers are owned on disk by SANDBOX_UID; each sandbox sees them as its own uid's
        # (idmap.py) and may change any template file, which overlayfs copies up into its
        # own layer (the template never changes).
        for path in [lower, *lower.rglob("*")]:
            os.lchown(path, SANDBOX_UID, SANDBOX_UID)


def run_python_setup(template: Template, namespace: dict) -> None:
    """Import the template's modules and run its Python setup into `namespace`."""
    try:
        forkserver.run_python_setup(template.name, template.python_modules, template.python_setup, namespace)
    except forkserver.SetupError as err:
        raise TemplateError(str(err)) from None


DEFAULT_TEMPLATE = Template(name="base")
