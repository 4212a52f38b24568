"""Idmapped layers (sandbox_init._stage_idmapped_layers), outside a sandbox: several
template layers and the sandbox's layer, owned on disk by SANDBOX_UID, appear owned by
the sandbox's uid; what it writes lands on disk as SANDBOX_UID."""

from __future__ import annotations

import os
import subprocess

import pytest
from tests.sandbox.forked import in_child

from venusrl.sandbox import linux
from venusrl.sandbox.sandbox_init import _stage_idmapped_layers
from venusrl.sandbox.spec import SANDBOX_UID, SandboxSpec

SANDBOX = 1_234_567


def _spec(tmp_path, lower: str) -> SandboxSpec:
    layer = tmp_path / "layer"
    for d in ("upper", "work", "tmp"):
        (layer / d).mkdir(parents=True)
    os.chown(layer / "upper", SANDBOX_UID, SANDBOX_UID)
    return SandboxSpec(sandbox_id="t", cgroup_procs=(), root=str(tmp_path / "root"), lower=lower,
                       upper=str(layer / "upper"), work=str(layer / "work"), tmp=str(layer / "tmp"),
                       read_only_binds=(), run_setup=False, uid=SANDBOX)


def _in_private_mount_namespace(fn) -> dict:
    """fn(keeper_pid) in a forked child with its own mount namespace and a keeper that has
    entered a fresh user namespace (as a sandbox's keeper does)."""

    def step() -> dict:
        linux.unshare(linux.CLONE_NEWNS)
        linux.mount("none", "/", None, linux.MS_REC | linux.MS_PRIVATE)
        keeper = subprocess.Popen(["unshare", "--user", "sh", "-c", "echo ready; read _"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert keeper.stdout.readline() == "ready\n"
            return fn(keeper.pid)
        finally:
            keeper.stdin.close()
            keeper.wait()

    return in_child(step)


@pytest.mark.needs_root
def test_several_lower_layers_and_the_upper_belong_to_the_sandbox(tmp_path):
    for name, text in (("top", "from top"), ("base", "from base")):
        (tmp_path / name).mkdir()
        (tmp_path / name / f"{name}.txt").write_text(text)
        (tmp_path / name / "shared.txt").write_text(text)
        for path in (tmp_path / name, *(tmp_path / name).iterdir()):
            os.lchown(path, SANDBOX_UID, SANDBOX_UID)
    spec = _spec(tmp_path, f"{tmp_path / 'top'}:{tmp_path / 'base'}")
    merged = tmp_path / "merged"
    merged.mkdir()

    def stage(keeper: int) -> dict:
        staging = str(tmp_path / "staging")
        lower, upper, work, tmp = _stage_idmapped_layers(spec, staging, keeper)
        linux.mount("overlay", str(merged), "overlay", 0, f"lowerdir={lower},upperdir={upper},workdir={work}")
        os.chdir(merged)  # pytest's directories above are root's alone
        os.setresuid(SANDBOX, SANDBOX, 0)  # write as the sandbox would (saved uid 0 to come back)
        with open("new.txt", "w") as f:
            f.write("mine")
        with open("base.txt", "a") as f:
            f.write(" and mine")
        os.setresuid(0, 0, 0)
        return {"owners": {p.name: p.stat().st_uid for p in merged.iterdir()},
                "shared": (merged / "shared.txt").read_text(), "base": (merged / "base.txt").read_text(),
                "tmp": tmp}

    result = _in_private_mount_namespace(stage)
    assert result["owners"] == {"top.txt": SANDBOX, "base.txt": SANDBOX, "shared.txt": SANDBOX, "new.txt": SANDBOX}
    assert result["shared"] == "from top"  # the topmost layer wins, as overlayfs orders them
    assert result["base"] == "from base and mine"
    assert result["tmp"].endswith("/layer/tmp")
    upper = tmp_path / "layer" / "upper"
    assert {p.name: p.stat().st_uid for p in upper.iterdir()} == {"new.txt": SANDBOX_UID, "base.txt": SANDBOX_UID}
    assert (tmp_path / "base" / "base.txt").read_text() == "from base"  # the template never changes
