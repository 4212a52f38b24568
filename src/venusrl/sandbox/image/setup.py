"""An image template's `setup_commands`, run once per node into the template's own layer.

The commands run as the image's root in a throwaway sandbox root: the image's layers
below, the template's layer as the overlay's upper directory (so what they write, delete
or change becomes that layer, whiteouts included), in fresh mount, PID, network, IPC and
UTS namespaces and the image's user namespace; no network, as in every sandbox. Started
by the node agent as `python -m venusrl.sandbox.image.setup` with a JSON job on stdin; it
exits 0 when every command did, else prints the failing command's error and exits 1.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from venusrl.sandbox import linux
from venusrl.sandbox.errors import TemplateError
from venusrl.sandbox.image.rootfs import ImageRoot

NAMESPACES = linux.CLONE_NEWNS | linux.CLONE_NEWNET | linux.CLONE_NEWIPC | linux.CLONE_NEWUTS | linux.CLONE_NEWPID


def run_setup(template: str, image: ImageRoot, layer: Path, commands: tuple[str, ...], env: dict[str, str],
              timeout_s: float = 600.0) -> None:
    """Run `commands` over `image` with `layer` as the writable layer; raises TemplateError."""
    scratch = layer.parent / f".{layer.name}-setup"
    shutil.rmtree(scratch, ignore_errors=True)
    for name in ("root", "work", "tmp"):
        (scratch / name).mkdir(parents=True)
    os.chmod(scratch / "tmp", 0o1777)
    job = {"image": image.to_json(), "upper": str(layer), "root": str(scratch / "root"), "work": str(scratch / "work"),
           "tmp": str(scratch / "tmp"), "commands": list(commands), "env": env, "timeout_s": timeout_s}
    try:
        done = subprocess.run([sys.executable, "-m", "venusrl.sandbox.image.setup"], input=json.dumps(job),
                              capture_output=True, text=True, timeout=timeout_s + 30)
    except subprocess.TimeoutExpired:
        raise TemplateError(f"template {template}: setup took longer than {timeout_s:.0f}s") from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if done.returncode != 0:
        raise TemplateError(f"template {template}: {done.stdout.strip()[-800:] or done.stderr.strip()[-800:]}")


def main() -> None:
    job = json.loads(sys.stdin.read())
    linux.unshare(NAMESPACES)
    pid = os.fork()
    if pid == 0:
        os._exit(_run_in_root(job))
    _, status = os.waitpid(pid, 0)
    sys.exit(0 if os.waitstatus_to_exitcode(status) == 0 else 1)


def _run_in_root(job: dict[str, Any]) -> int:
    from venusrl.sandbox.image import rootfs
    from venusrl.sandbox.sandbox_init import _build_dev

    image = ImageRoot.from_json(job["image"])
    try:
        rootfs.build_root(SimpleNamespace(image=job["image"], upper=job["upper"], root=job["root"],
                                          work=job["work"], tmp=job["tmp"]), _build_dev)
        os.setgroups([])
        os.setresgid(0, 0, 0)
        os.setresuid(0, 0, 0)  # the image's root, which is UID_BASE on the host
        linux.prctl(linux.PR_SET_NO_NEW_PRIVS, 1)
        for command in job["commands"]:
            done = subprocess.run(["/bin/bash", "-c", command], cwd=image.workdir, env=job["env"],
                                  capture_output=True, text=True, timeout=job["timeout_s"])
            if done.returncode != 0:
                print(f"setup command {command!r} exited {done.returncode}: {done.stderr.strip()[-500:]}")
                return 1
    except Exception as err:  # noqa: BLE001 - reported to the node agent, which raises TemplateError
        print(f"setup could not run: {type(err).__name__}: {err}")
        return 1
    return 0


if __name__ == "__main__":
    main()
