"""The sandbox seccomp filter: the BPF program agrees with the table of denials (checked by
running it in a small classic-BPF interpreter), the syscall numbers agree with the kernel
headers, and the kernel really enforces it (installed in a forked child; needs no root)."""

from __future__ import annotations

import ctypes
import errno
import os
import re
import shutil
import struct
import subprocess
import threading
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.sandbox.forked import in_child

from venusrl.sandbox import linux, seccomp
from venusrl.sandbox.seccomp import AUDIT_ARCH, DENIED, SYSCALLS, X32_SYSCALL_BIT, Instruction

MACHINES = sorted(AUDIT_ARCH)


def run_filter(program: list[Instruction], nr: int, arch: int, arg0: int) -> int:
    """Classic BPF as the kernel runs it, for the opcodes the filter uses."""
    data = struct.pack("=IIQ6Q", nr, arch, 0, arg0, 0, 0, 0, 0, 0)
    pc, acc = 0, 0
    for _ in range(len(program)):  # forward jumps only: at most one pass
        ins = program[pc]
        if ins.code == seccomp.LD_W_ABS:
            acc = struct.unpack_from("=I", data, ins.k)[0]
            pc += 1
            continue
        if ins.code == seccomp.RET_K:
            return ins.k
        taken = {seccomp.JEQ_K: acc == ins.k, seccomp.JGE_K: acc >= ins.k, seccomp.JSET_K: bool(acc & ins.k)}[ins.code]
        pc += 1 + (ins.jt if taken else ins.jf)
    raise AssertionError("program ran off its end")


def decision_by_table(machine: str, nr: int, arch: int, arg0: int) -> int:
    if arch != AUDIT_ARCH[machine] or (machine == "x86_64" and nr >= X32_SYSCALL_BIT):
        return seccomp.RET_KILL_PROCESS
    numbers = SYSCALLS[machine]
    for denial in DENIED:
        if numbers.get(denial.syscall) == nr:
            if denial.when_flags and not arg0 & 0xFFFFFFFF & denial.when_flags:
                return seccomp.RET_ALLOW
            return seccomp.RET_ERRNO | denial.errno
    return seccomp.RET_ALLOW


def _syscall_numbers(machine: str):
    return st.sampled_from(sorted(SYSCALLS[machine].values())) | st.integers(0, 2**32 - 1) | st.integers(0, 500)


@given(data=st.data())
def test_program_decides_exactly_as_the_table_says(data):
    machine = data.draw(st.sampled_from(MACHINES))
    nr = data.draw(_syscall_numbers(machine))
    arch = data.draw(st.sampled_from([*AUDIT_ARCH.values(), 0x40000003]) | st.integers(0, 2**32 - 1))  # + i386
    arg0 = data.draw(st.sampled_from([0, linux.CLONE_NEWUSER, 0x11 | linux.CLONE_NEWNET, 0x3D0F00]) | st.integers(0, 2**64 - 1))
    program = seccomp.build(machine)
    assert run_filter(program, nr, arch, arg0) == decision_by_table(machine, nr, arch, arg0)


def test_the_denials_that_matter_are_denied():
    program = seccomp.build("x86_64")
    arch = AUDIT_ARCH["x86_64"]
    nr = SYSCALLS["x86_64"]
    eperm = seccomp.RET_ERRNO | errno.EPERM
    assert run_filter(program, nr["keyctl"], arch, 0) == eperm
    assert run_filter(program, nr["unshare"], arch, linux.CLONE_NEWUSER) == eperm
    assert run_filter(program, nr["unshare"], arch, 0x400) == seccomp.RET_ALLOW  # CLONE_FILES: harmless
    assert run_filter(program, nr["clone"], arch, 0x01200011) == seccomp.RET_ALLOW  # fork()'s flags
    assert run_filter(program, nr["clone"], arch, 0x01200011 | linux.CLONE_NEWUSER) == eperm
    assert run_filter(program, nr["clone3"], arch, 0) == seccomp.RET_ERRNO | errno.ENOSYS
    assert run_filter(program, 0, arch, 0) == seccomp.RET_ALLOW  # read
    assert run_filter(program, nr["keyctl"] | X32_SYSCALL_BIT, arch, 0) == seccomp.RET_KILL_PROCESS
    assert run_filter(program, 1, 0x40000003, 0) == seccomp.RET_KILL_PROCESS  # i386 via int 0x80


def test_every_denial_is_justified_and_numbered():
    names = [d.syscall for d in DENIED]
    assert len(names) == len(set(names))
    for denial in DENIED:
        assert len(denial.reason) >= 15, denial
        assert denial.syscall in SYSCALLS["x86_64"], denial
    assert set(SYSCALLS["x86_64"]) == set(names)
    assert set(names) - set(SYSCALLS["aarch64"]) == {"iopl", "ioperm"}  # x86-only calls


@pytest.mark.parametrize(("machine", "header"), [
    ("x86_64", "/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
    ("aarch64", "/usr/include/asm-generic/unistd.h"),
])
def test_numbers_agree_with_the_kernel_headers(machine, header):
    if not Path(header).exists():
        pytest.skip(f"{header} not installed (Debian package linux-libc-dev)")
    text = Path(header).read_text()
    for name, nr in SYSCALLS[machine].items():
        found = re.search(rf"#define __NR_{name}\s+(\d+)", text)
        assert found and int(found.group(1)) == nr, (machine, name, nr)


def test_assembler_refuses_what_classic_bpf_cannot_encode():
    far = [seccomp._Op(seccomp.JEQ_K, 1, jt="end"), *[seccomp._Op(seccomp.LD_W_ABS, 0)] * 256, "end",
           seccomp._Op(seccomp.RET_K, 0)]
    with pytest.raises(ValueError, match="spans 256"):
        seccomp.assemble(far)
    with pytest.raises(ValueError, match="undefined label"):
        seccomp.assemble([seccomp._Op(seccomp.JEQ_K, 1, jt="nowhere"), seccomp._Op(seccomp.RET_K, 0)])
    with pytest.raises(RuntimeError, match="no syscall table for architecture 'mips'"):
        seccomp.build("mips")


def _errno_of(fn) -> int:
    result = fn()
    return 0 if result >= 0 else ctypes.get_errno()


def _probe_under_filter() -> dict:
    """Runs in a forked child after the filter is installed."""
    libc = ctypes.CDLL(None, use_errno=True)
    nr = SYSCALLS[os.uname().machine]
    out: dict = {
        "unshare_newuser": _errno_of(lambda: libc.unshare(linux.CLONE_NEWUSER)),
        "keyctl": _errno_of(lambda: libc.syscall(nr["keyctl"], 0, -3, 0)),  # KEYCTL_GET_KEYRING_ID @u
        "clone3": _errno_of(lambda: libc.syscall(nr["clone3"], 0, 0)),
        "bpf": _errno_of(lambda: libc.syscall(nr["bpf"], 0, 0, 0)),
        "getpid": _errno_of(lambda: libc.getpid()),
    }
    pid = os.fork()
    if pid == 0:
        os._exit(3)
    out["fork_exit"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    seen = []
    thread = threading.Thread(target=seen.append, args=(1,))
    thread.start()
    thread.join()
    out["thread_ran"] = seen == [1]
    if shutil.which("unshare"):
        done = subprocess.run(["unshare", "-Ur", "true"], capture_output=True, text=True)
        out["unshare_Ur"] = [done.returncode, done.stderr.strip()]
    out["subprocess"] = subprocess.run(["sh", "-c", "exit 5"]).returncode
    return out


@pytest.mark.skipif(os.uname().machine not in AUDIT_ARCH, reason="no syscall table for this architecture")
def test_kernel_enforces_the_filter_and_ordinary_work_goes_on():
    def filtered() -> dict:
        linux.prctl(linux.PR_SET_NO_NEW_PRIVS, 1)
        seccomp.install()
        return _probe_under_filter()

    result = in_child(filtered)
    assert result["unshare_newuser"] == errno.EPERM
    assert result["keyctl"] == errno.EPERM
    assert result["clone3"] == errno.ENOSYS
    assert result["bpf"] == errno.EPERM
    assert result["getpid"] == 0
    assert result["fork_exit"] == 3 and result["thread_ran"] and result["subprocess"] == 5
    if "unshare_Ur" in result:
        assert result["unshare_Ur"][0] != 0 and "Operation not permitted" in result["unshare_Ur"][1]
