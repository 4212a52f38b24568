"""The seccomp filter every sandbox process runs under, built as classic BPF.

A sandbox already runs as its own unprivileged host uid with no capabilities, in its own
mount/PID/network/IPC/UTS namespaces. The filter takes away the kernel surface that is
still reachable without privilege and that no tool (shell, compiler, interpreter, test
runner) needs. Each denial below says why; the filter allows everything else, so tools
keep working as on the host.

The program (one per architecture, named by its AUDIT_ARCH value):
  1. arch check: a syscall made under any other ABI kills the process (on x86-64 an
     `int 0x80` i386 call, or an x32 call with __X32_SYSCALL_BIT set, would reach the
     kernel through a different syscall table that the numbers below do not describe);
  2. one compare per denied syscall, in the table's order;
  3. allow;
  4. for clone/unshare, a second test on the flags argument, then allow.
Classic BPF jumps are 8-bit forward offsets; `assemble` checks every one fits.
"""

from __future__ import annotations

import errno
import os
import struct
from dataclasses import dataclass

from venusrl.sandbox import forkserver, linux

# struct seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6]
OFFSET_NR = 0
OFFSET_ARCH = 4
OFFSET_ARG0_LOW = 16  # little-endian: the low 32 bits of args[0], where clone/unshare flags live

RET_KILL_PROCESS = 0x80000000
RET_ERRNO = 0x00050000
RET_ALLOW = 0x7FFF0000

# opcodes of classic BPF (linux/bpf_common.h)
LD_W_ABS = 0x20
JEQ_K = 0x15
JGE_K = 0x35
JSET_K = 0x45
RET_K = 0x06

AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
X32_SYSCALL_BIT = 0x40000000

NAMESPACE_FLAGS = (linux.CLONE_NEWNS | linux.CLONE_NEWCGROUP | linux.CLONE_NEWUTS | linux.CLONE_NEWIPC
                   | linux.CLONE_NEWUSER | linux.CLONE_NEWPID | linux.CLONE_NEWNET | linux.CLONE_NEWTIME)


@dataclass(frozen=True)
class Denial:
    syscall: str
    reason: str
    errno: int = errno.EPERM
    when_flags: int = 0  # nonzero: denied only when args[0] has one of these bits


DENIED: tuple[Denial, ...] = (
    # Keyrings are keyed by host uid and outlive every process: a key one sandbox adds is a
    # channel to whatever later runs as that uid, and the session keyring is inherited.
    Denial("add_key", "keyrings outlive the sandbox and are shared by uid: a covert channel"),
    Denial("request_key", "keyrings outlive the sandbox and are shared by uid: a covert channel"),
    Denial("keyctl", "keyrings outlive the sandbox and are shared by uid: a covert channel"),
    # An unprivileged user namespace gives full capabilities over fresh namespaces: mount,
    # netfilter, and much kernel code no tool needs (the root of many privilege escalations).
    Denial("unshare", "no new namespaces: a user namespace grants capabilities over a wider kernel surface",
           when_flags=NAMESPACE_FLAGS),
    Denial("clone", "no new namespaces: a user namespace grants capabilities over a wider kernel surface",
           when_flags=NAMESPACE_FLAGS),
    # clone3 passes its flags in a struct that seccomp cannot read. ENOSYS (as on a kernel
    # without clone3) makes glibc, musl, Go and Rust fall back to clone, whose flags are checked.
    Denial("clone3", "flags unreadable by seccomp; callers fall back to clone", errno=errno.ENOSYS),
    Denial("setns", "no joining other namespaces"),
    # Kernel code and kernel-level programs.
    Denial("init_module", "loads kernel code"),
    Denial("finit_module", "loads kernel code"),
    Denial("delete_module", "unloads kernel code"),
    Denial("kexec_load", "replaces the running kernel"),
    Denial("kexec_file_load", "replaces the running kernel"),
    Denial("bpf", "eBPF programs and maps: large verifier/JIT attack surface, no tool needs it"),
    Denial("perf_event_open", "hardware counters and kernel tracing: side channels and a large attack surface"),
    Denial("userfaultfd", "lets a process stall kernel page faults at will: a standard exploit primitive"),
    Denial("io_uring_setup", "io_uring bypasses per-syscall filtering and is a frequent exploit vector",
           errno=errno.ENOSYS),
    Denial("io_uring_enter", "io_uring bypasses per-syscall filtering", errno=errno.ENOSYS),
    Denial("io_uring_register", "io_uring bypasses per-syscall filtering", errno=errno.ENOSYS),
    # Other processes' memory. The PID namespace already hides every process outside the
    # sandbox; this is the second wall (and debuggers are not a tool call's business).
    Denial("ptrace", "reads and writes another process's memory and registers"),
    Denial("process_vm_readv", "reads another process's memory"),
    Denial("process_vm_writev", "writes another process's memory"),
    Denial("kcmp", "compares kernel objects of other processes (probes for kernel pointers)"),
    Denial("pidfd_getfd", "steals a file descriptor from another process"),
    # The filesystem view is built by the sandbox init and must stay as it is.
    Denial("mount", "changes the filesystem view"),
    Denial("umount2", "changes the filesystem view"),
    Denial("pivot_root", "changes the filesystem view"),
    Denial("chroot", "changes the filesystem view"),
    Denial("open_tree", "new mount API: changes the filesystem view"),
    Denial("move_mount", "new mount API: changes the filesystem view"),
    Denial("fsopen", "new mount API: changes the filesystem view"),
    Denial("fsconfig", "new mount API: changes the filesystem view"),
    Denial("fsmount", "new mount API: changes the filesystem view"),
    Denial("fspick", "new mount API: changes the filesystem view"),
    Denial("mount_setattr", "new mount API: changes the filesystem view"),
    Denial("open_by_handle_at", "opens files by handle, around every path check (the 'shocker' escape)"),
    # Host-wide state: the node's clock, swap, accounting, console and power. These need
    # capabilities the sandbox lacks; the filter is the second wall.
    Denial("reboot", "reboots or halts the host"),
    Denial("swapon", "changes the host's swap devices"),
    Denial("swapoff", "changes the host's swap devices"),
    Denial("acct", "switches the host's process accounting"),
    Denial("settimeofday", "sets the host's clock"),
    Denial("clock_settime", "sets the host's clock"),
    Denial("clock_adjtime", "adjusts the host's clock"),
    Denial("syslog", "kernel log: kernel addresses and other tenants' messages"),
    Denial("iopl", "raw I/O port access to the host's hardware"),
    Denial("ioperm", "raw I/O port access to the host's hardware"),
)

# Syscall numbers (x86-64: asm/unistd_64.h; aarch64: asm-generic/unistd.h). A syscall the
# architecture does not have (iopl on aarch64) needs no denial there.
SYSCALLS = {
    "x86_64": {
        "add_key": 248, "request_key": 249, "keyctl": 250, "unshare": 272, "clone": 56, "clone3": 435,
        "setns": 308, "init_module": 175, "finit_module": 313, "delete_module": 176, "kexec_load": 246,
        "kexec_file_load": 320, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "ptrace": 101,
        "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312, "pidfd_getfd": 438,
        "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "open_tree": 428,
        "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
        "mount_setattr": 442, "open_by_handle_at": 304, "reboot": 169, "swapon": 167, "swapoff": 168,
        "acct": 163, "settimeofday": 164, "clock_settime": 227, "clock_adjtime": 305, "syslog": 103,
        "iopl": 172, "ioperm": 173,
    },
    "aarch64": {
        "add_key": 217, "request_key": 218, "keyctl": 219, "unshare": 97, "clone": 220, "clone3": 435,
        "setns": 268, "init_module": 105, "finit_module": 273, "delete_module": 106, "kexec_load": 104,
        "kexec_file_load": 294, "bpf": 280, "perf_event_open": 241, "userfaultfd": 282,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "ptrace": 117,
        "process_vm_readv": 270, "process_vm_writev": 271, "kcmp": 272, "pidfd_getfd": 438,
        "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51, "open_tree": 428,
        "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
        "mount_setattr": 442, "open_by_handle_at": 265, "reboot": 142, "swapon": 224, "swapoff": 225,
        "acct": 89, "settimeofday": 170, "clock_settime": 112, "clock_adjtime": 266, "syslog": 116,
    },
}


@dataclass(frozen=True)
class Instruction:
    """One `struct sock_filter`: code, jump-if-true, jump-if-false, constant."""

    code: int
    jt: int
    jf: int
    k: int


@dataclass(frozen=True)
class _Op:
    code: int
    k: int
    jt: str | None = None  # label to jump to when true; None: the next instruction
    jf: str | None = None


def assemble(items: list[_Op | str]) -> list[Instruction]:
    """Resolve labels (the strings in `items`) into classic BPF's relative forward jumps."""
    labels: dict[str, int] = {}
    ops: list[_Op] = []
    for item in items:
        if isinstance(item, str):
            if item in labels:
                raise ValueError(f"seccomp: label {item!r} defined twice")
            labels[item] = len(ops)
        else:
            ops.append(item)

    def offset(at: int, label: str | None) -> int:
        if label is None:
            return 0
        if label not in labels:
            raise ValueError(f"seccomp: undefined label {label!r}")
        distance = labels[label] - at - 1
        if not 0 <= distance <= 255:
            raise ValueError(f"seccomp: jump to {label!r} from {at} spans {distance} (classic BPF allows 0..255)")
        return distance

    return [Instruction(op.code, offset(i, op.jt), offset(i, op.jf), op.k) for i, op in enumerate(ops)]


def build(machine: str) -> list[Instruction]:
    """The filter for `machine` (as `os.uname().machine` names it)."""
    if machine not in AUDIT_ARCH:
        raise RuntimeError(f"seccomp: no syscall table for architecture {machine!r} (have {', '.join(AUDIT_ARCH)})")
    numbers = SYSCALLS[machine]
    items: list[_Op | str] = [
        _Op(LD_W_ABS, OFFSET_ARCH),
        _Op(JEQ_K, AUDIT_ARCH[machine], jf="kill"),
        _Op(LD_W_ABS, OFFSET_NR),
    ]
    if machine == "x86_64":
        items.append(_Op(JGE_K, X32_SYSCALL_BIT, jt="kill"))
    checks: list[_Op | str] = []
    for denial in DENIED:
        nr = numbers.get(denial.syscall)
        if nr is None:
            continue
        if denial.when_flags:
            checks += [f"flags-{denial.syscall}", _Op(LD_W_ABS, OFFSET_ARG0_LOW),
                       _Op(JSET_K, denial.when_flags, jt=f"errno-{denial.errno}"), _Op(RET_K, RET_ALLOW)]
            items.append(_Op(JEQ_K, nr, jt=f"flags-{denial.syscall}"))
        else:
            items.append(_Op(JEQ_K, nr, jt=f"errno-{denial.errno}"))
    items += [_Op(RET_K, RET_ALLOW), *checks]
    for code in sorted({d.errno for d in DENIED}):
        items += [f"errno-{code}", _Op(RET_K, RET_ERRNO | code)]
    items += ["kill", _Op(RET_K, RET_KILL_PROCESS)]
    return assemble(items)


def pack(program: list[Instruction]) -> bytes:
    return b"".join(struct.pack("=HBBI", i.code, i.jt, i.jf, i.k) for i in program)


def packed(machine: str | None = None) -> bytes:
    """The filter for `machine` (default: this one), as the kernel takes it."""
    return pack(build(machine or os.uname().machine))


def install(machine: str | None = None) -> None:
    """Install the filter on the calling thread; it is inherited by every child and can
    never be removed. The caller must have set no_new_privs (or hold CAP_SYS_ADMIN)."""
    forkserver.install_seccomp(packed(machine))
