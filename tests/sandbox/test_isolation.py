"""Each test is a real attempt from inside a sandbox to break out of it."""

from __future__ import annotations

import os
import socket
import threading

import pytest

from venusrl.sandbox.api import Sandbox
from venusrl.sandbox.template import Template

pytestmark = pytest.mark.needs_root  # real sandboxes: see conftest.py

MiB = 1 << 20


def test_no_network(cluster):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    accepted = []
    listener.settimeout(3)
    waiter = threading.Thread(target=lambda: accepted.append(_accept(listener)))
    waiter.start()
    sandbox = Sandbox.create(cluster.controller)
    try:
        probe = (
            "import socket\n"
            f"for target in [('127.0.0.1', {port}), ('8.8.8.8', 53), ('1.1.1.1', 443)]:\n"
            "    try:\n"
            "        socket.create_connection(target, timeout=2); print('CONNECTED', target)\n"
            "    except OSError as e: print('refused', target, e.errno)\n"
        )
        sandbox.files.write("probe.py", probe)
        result = sandbox.run("python3 probe.py; ls /sys/class/net 2>/dev/null; cat /proc/net/dev", timeout=20)
        assert "CONNECTED" not in result.stdout
        assert result.stdout.count("refused") == 3
        interfaces = [line.split(":")[0].strip() for line in result.stdout.splitlines() if ":" in line and "|" not in line]
        assert interfaces == ["lo"]
        waiter.join()
        assert accepted == [None]
    finally:
        sandbox.kill()
        listener.close()


def _accept(listener: socket.socket):
    try:
        conn, _ = listener.accept()
        conn.close()
        return "accepted"
    except OSError:
        return None


WARM_PYTHON_ARGS = "/usr/bin/python3 -I - "  # image/zygote.py: the image's Python on forkserver.py


def test_cannot_see_or_signal_host_or_other_sandboxes(cluster):
    a = Sandbox.create(cluster.controller)
    b = Sandbox.create(cluster.controller)
    try:
        b.run("sleep 300 >/dev/null 2>&1 &", timeout=5)
        b_pids = [p for p in _sandbox_pids(cluster, b)]
        targets = [os.getpid(), os.getppid(), *b_pids]  # host pids: the test runner, b's processes
        result = a.run(
            "ps -eo args; "
            + "; ".join(f"kill -9 {pid} 2>/dev/null && echo KILLED {pid}" for pid in targets),
            timeout=10,
        )
        listed = result.stdout.splitlines()
        warm = sum(line.startswith(WARM_PYTHON_ARGS) for line in listed)  # an image template's warm Python
        assert warm <= 1 and len(listed) <= 4 + warm, listed  # header, its init, the shell, ps (and no KILLED)
        assert not any("pytest" in line or "node_server" in line or "sleep" in line for line in listed)
        assert not any(line.startswith("KILLED") for line in listed)
        assert all(os.path.exists(f"/proc/{pid}") for pid in b_pids)
        assert b.run("echo alive").stdout == "alive\n"
    finally:
        a.kill()
        b.kill()


def _sandbox_pids(cluster, sandbox: Sandbox) -> list[int]:
    from venusrl.sandbox.cgroups import Cgroup, detect_layout

    route = cluster.controller.routes[sandbox.sandbox_id]
    node = cluster.nodes[route.node_id]
    return Cgroup(detect_layout(), f"{node.settings.cgroup}/sb-{sandbox.sandbox_id}").pids()


def test_cannot_write_outside_its_layer(cluster, tmp_path):
    sandbox = Sandbox.create(cluster.controller)
    host_marker = tmp_path / "marker"
    try:
        attempts = ["/etc/evil", "/usr/evil", "/evil", "/proc/sys/kernel/hostname", "/dev/evil",
                    str(host_marker), f"{cluster.workdir}/evil"]
        script = "; ".join(f"(echo x > {path}) 2>/dev/null && echo WROTE {path}" for path in attempts)
        script += "; mount -t tmpfs none /workspace 2>/dev/null && echo MOUNTED; id -u; echo ok > /workspace/mine && echo OWN"
        result = sandbox.run(script, timeout=10)
        assert "WROTE" not in result.stdout
        assert "MOUNTED" not in result.stdout
        assert "OWN" in result.stdout
        assert result.stdout.split()[-2] != "0"  # not root
        assert not host_marker.exists()
        assert not os.path.exists("/etc/evil") and not os.path.exists("/evil")
    finally:
        sandbox.kill()


def test_cannot_read_another_sandboxs_files(cluster):
    a = Sandbox.create(cluster.controller)
    b = Sandbox.create(cluster.controller)
    try:
        a.files.write("secret.txt", "TOPSECRET")
        a_layer = cluster.controller.routes[a.sandbox_id].layer
        result = b.run(f"cat {a_layer}/upper/secret.txt; cat /workspace/secret.txt; "
                       "find / -path /proc -prune -o -path /usr -prune -o -name secret.txt -print 2>/dev/null; "
                       "grep -rs TOPSECRET /workspace /tmp /dev/shm", timeout=60)
        assert "TOPSECRET" not in result.stdout and "secret.txt" not in result.stdout
        assert a.files.read("secret.txt") == "TOPSECRET"
    finally:
        a.kill()
        b.kill()


def test_fork_bomb_stops_at_pids_limit(cluster):
    sandbox = Sandbox.create(cluster.controller)
    try:
        result = sandbox.run("bomb() { bomb | bomb & }; bomb; sleep 3", timeout=5)
        metrics = sandbox.metrics()
        assert metrics["pids_refused"] > 0
        assert sandbox.run("echo survived", timeout=10).stdout == "survived\n"
        assert result.exit_code != 0 or result.timed_out
    finally:
        sandbox.kill()


def test_memory_bomb_stops_at_limit_without_harming_neighbours(cluster):
    bomb = Sandbox.create(cluster.controller, memory_limit=64 * MiB)
    neighbour = Sandbox.create(cluster.controller, memory_limit=64 * MiB)
    try:
        neighbour.files.write("state.txt", "before")
        result = bomb.run("python3 -c 'b = bytearray(512 << 20)'; echo rc=$?", timeout=30)
        assert "rc=137" in result.stdout  # SIGKILL from its own cgroup's OOM killer
        assert bomb.metrics()["oom_kills"] >= 1
        assert bomb.run("echo init-alive").stdout == "init-alive\n"
        assert neighbour.metrics()["oom_kills"] == 0
        assert neighbour.files.read("state.txt") == "before"
        for node in cluster.controller.nodes.values():
            assert node.call("status")["oom_events"] == 0  # the node budget was never hit
    finally:
        bomb.kill()
        neighbour.kill()


def test_timeout_kills_whole_process_tree(cluster):
    sandbox = Sandbox.create(cluster.controller)
    try:
        result = sandbox.run("sleep 101 & setsid sleep 102 & (sleep 103 &) ; sleep 104", timeout=1)
        assert result.timed_out
        left = sandbox.run("ps -eo comm,args | grep -c 'sleep 10[1-4]$'", timeout=10)
        assert left.stdout.strip() == "0"
    finally:
        sandbox.kill()


def test_random_state_is_reseeded_per_sandbox(cluster):
    template = Template(name="seeded", python_modules=("numpy",), python_setup="numpy.random.seed(0)",
                        python_start="open('/tmp/draw', 'w').write(repr(numpy.random.random()))")
    a = Sandbox.create(cluster.controller, template)
    b = Sandbox.create(cluster.controller, template)
    try:
        assert a.files.read("/tmp/draw") != b.files.read("/tmp/draw")
    finally:
        a.kill()
        b.kill()


# Each probe is a syscall a sandbox would need to leave its box, made with arguments that an
# unprivileged process outside any filter may use (so EPERM/ENOSYS here is the filter's).
KERNEL_PROBES = r'''
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
NR = {"x86_64": dict(add_key=248, keyctl=250, clone3=435, bpf=321, perf_event_open=298, userfaultfd=323,
                     io_uring_setup=425, ptrace=101, process_vm_readv=310, mount=165, init_module=175,
                     kexec_load=246, setns=308),
      "aarch64": dict(add_key=217, keyctl=219, clone3=435, bpf=280, perf_event_open=241, userfaultfd=282,
                      io_uring_setup=425, ptrace=117, process_vm_readv=270, mount=40, init_module=105,
                      kexec_load=104, setns=268)}[os.uname().machine]
def call(name, *args):
    return 0 if libc.syscall(NR[name], *args) >= 0 else ctypes.get_errno()
attr = ctypes.create_string_buffer(128)
attr[0:4] = (1).to_bytes(4, "little"); attr[8:12] = (128).to_bytes(4, "little")   # software event, size
attr[40:48] = ((1 << 5) | (1 << 6)).to_bytes(8, "little")  # exclude_kernel, exclude_hv
iov = (ctypes.c_char * 8)()
vec = (ctypes.c_uint64 * 2)(ctypes.addressof(iov), 8)
params = ctypes.create_string_buffer(120)
own_ns = os.open("/proc/self/ns/uts", os.O_RDONLY)
out = {
    "add_key @u": call("add_key", b"user", b"probe", b"A-secret", 6, ctypes.c_int(-4)),
    "keyctl(GET_KEYRING_ID @s)": call("keyctl", 0, ctypes.c_int(-3), 0),
    "unshare(CLONE_NEWUSER)": 0 if libc.unshare(0x10000000) == 0 else ctypes.get_errno(),
    "clone3": call("clone3", 0, 0),
    "setns": call("setns", own_ns, 0),
    "bpf": call("bpf", 0, 0, 0),
    "perf_event_open": call("perf_event_open", attr, 0, -1, -1, 0),
    "userfaultfd(user mode)": call("userfaultfd", 1),
    "io_uring_setup": call("io_uring_setup", 1, params),
    "ptrace(TRACEME)": call("ptrace", 0, 0, 0, 0),
    "process_vm_readv(self)": call("process_vm_readv", os.getpid(), vec, 1, vec, 1, 0),
    "mount tmpfs": call("mount", b"none", b"/tmp", b"tmpfs", 0, 0),
    "init_module": call("init_module", 0, 0, b""),
    "kexec_load": call("kexec_load", 0, 0, 0, 0),
}
print(json.dumps(out))
'''


def test_kernel_surface_outside_the_box_is_denied(cluster):
    import errno
    import json

    sandbox = Sandbox.create(cluster.controller)
    try:
        sandbox.files.write("probes.py", KERNEL_PROBES)
        result = sandbox.run("python3 probes.py", timeout=30)
        assert result.exit_code == 0, result.stderr
        found = json.loads(result.stdout)
        enosys = {"clone3", "io_uring_setup"}
        assert found == {name: errno.ENOSYS if name in enosys else errno.EPERM for name in found}
    finally:
        sandbox.kill()


def test_nested_user_namespaces_are_refused(cluster):
    sandbox = Sandbox.create(cluster.controller)
    try:
        result = sandbox.run("unshare -Ur id; echo rc=$?; unshare -r --map-root-user true; echo rc=$?", timeout=20)
        assert "uid=0" not in result.stdout
        assert result.stdout.count("rc=1") == 2
        assert result.stderr.count("Operation not permitted") == 2
    finally:
        sandbox.kill()


def _host_key(name: str, payload: bytes) -> int:
    """Add a key to root's user keyring, as any process of the node's uid could."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    key = libc.syscall(248 if os.uname().machine == "x86_64" else 217, b"user", name.encode(), payload,
                       len(payload), ctypes.c_int(-4))
    assert key > 0, os.strerror(ctypes.get_errno())
    return key


def _drop_host_key(key: int) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall(250 if os.uname().machine == "x86_64" else 219, 9, key, ctypes.c_int(-4))  # KEYCTL_UNLINK


def test_keyrings_carry_nothing_between_sandboxes_or_from_the_host(cluster):
    import shutil
    import uuid

    if not shutil.which("keyctl"):
        pytest.skip("keyctl not installed (Debian package keyutils; `make system-deps`)")
    name = f"venusrl-probe-{uuid.uuid4().hex[:8]}"
    host_key = _host_key(name, b"HOSTSECRET")
    a = Sandbox.create(cluster.controller)
    b = Sandbox.create(cluster.controller)
    try:
        uid_a, uid_b = (int(s.run("id -u").stdout) for s in (a, b))
        assert uid_a != uid_b and 0 not in (uid_a, uid_b)
        planted = a.run(f"keyctl add user {name} ASECRET @u; keyctl add user {name} ASECRET @s; "
                        f"keyctl padd user {name} @us <<< ASECRET; keyctl show @s", timeout=20)
        assert "Operation not permitted" in planted.stderr and "ASECRET" not in planted.stdout
        looked = b.run(f"keyctl search @u user {name}; keyctl search @s user {name}; keyctl print {host_key}; "
                       f"keyctl request user {name}; cat /proc/keys; keyctl show @s", timeout=20)
        assert "ASECRET" not in looked.stdout and "HOSTSECRET" not in looked.stdout
        assert name not in looked.stdout  # not even listed in /proc/keys
        assert looked.exit_code != 0
    finally:
        a.kill()
        b.kill()
        _drop_host_key(host_key)


def test_disk_quota_stops_writes_inside_and_spares_the_host(cluster):
    import shutil

    from venusrl.sandbox.errors import InvalidRequest

    template = Template(name="quota-probe", files={"kept.txt": "kept"}, disk_quota="24MiB", inode_quota=1000)
    sandbox = Sandbox.create(cluster.controller, template)
    neighbour = Sandbox.create(cluster.controller, template)
    host_free = shutil.disk_usage(cluster.workdir).free
    try:
        filled = sandbox.run("dd if=/dev/zero of=/workspace/big bs=1M count=200 2>&1; "
                             "dd if=/dev/zero of=/tmp/big bs=1M count=200 2>&1; "
                             "for i in $(seq 2000); do touch /workspace/f$i 2>/dev/null || { echo stopped at $i; break; }; done",
                             timeout=60)
        assert filled.stdout.count("No space left on device") == 2
        stopped_at = int(filled.stdout.split("stopped at ")[1].split()[0])
        assert 900 < stopped_at <= 1100
        assert shutil.disk_usage(cluster.workdir).free > host_free - 40 * MiB  # 200 MiB x 2 were asked
        metrics = sandbox.metrics()
        assert metrics["disk_used_bytes"] > 20 * MiB and metrics["disk_quota_bytes"] <= 24 * MiB
        with pytest.raises(InvalidRequest, match=r"more.bin: No space left on device .*disk_quota=25165824 bytes"):
            sandbox.files.write("more.bin", "z" * (1 << 20))
        assert neighbour.run("dd if=/dev/zero of=/workspace/mine bs=1M count=8 2>&1 && echo fine").stdout.endswith("fine\n")
        freed = sandbox.run("rm -f /workspace/big /tmp/big /workspace/f*; echo again > /workspace/after && cat /workspace/kept.txt")
        assert freed.stdout == "kept"
    finally:
        sandbox.kill()
        neighbour.kill()


def test_a_migrated_sandbox_owns_its_files_under_its_new_uid(cluster):
    template = Template(name="owned", files={"given.txt": "from template\n"})
    sandbox = Sandbox.create(cluster.controller, template)
    try:
        sandbox.run("echo mine > made.txt && chmod 600 given.txt && echo scratch > /tmp/s")
        before = int(sandbox.run("id -u").stdout)
        route = cluster.controller.routes[sandbox.sandbox_id]
        target = next(n for n in cluster.controller.nodes if n != route.node_id)
        cluster.controller.migrate(sandbox.sandbox_id, target)
        after = int(sandbox.run("id -u").stdout)
        assert after != before  # the source still held its uid while the copy started
        result = sandbox.run("echo more >> made.txt && echo more >> given.txt && echo more >> /tmp/s && "
                             "stat -c %u made.txt given.txt /tmp/s | sort -u && cat made.txt given.txt /tmp/s")
        assert result.exit_code == 0, result.stderr
        assert result.stdout == f"{after}\nmine\nmore\nfrom template\nmore\nscratch\nmore\n"
    finally:
        sandbox.kill()


INOTIFY_HOG = r'''
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
held = []
while libc.inotify_init1(os.O_CLOEXEC) >= 0:
    held.append(1)
print(len(held), ctypes.get_errno(), flush=True)
open("/tmp/hogging", "w").close()
os.read(0, 1)  # stdin is a pipe nobody writes: hold them until the sandbox is killed
'''


def test_per_uid_kernel_limits_are_each_sandboxs_own(cluster):
    """fs.inotify.max_user_instances counts per uid: with one uid for all sandboxes, one
    sandbox holding every instance would break file watching in all the others."""
    hog = Sandbox.create(cluster.controller)
    other = Sandbox.create(cluster.controller)
    try:
        hog.files.write("hog.py", INOTIFY_HOG)
        started = hog.run("(sleep 600 | python3 hog.py > /tmp/hog.out) >/dev/null 2>&1 & "
                          "while [ ! -e /tmp/hogging ]; do sleep 0.01; done", timeout=30)
        assert not started.timed_out
        count, code = hog.files.read("/tmp/hog.out").split()
        assert int(count) >= 1 and int(code) == 24  # EMFILE: this uid's instances are used up
        probe = "import ctypes; print(ctypes.CDLL(None, use_errno=True).inotify_init1(0) >= 0)"
        assert other.run(f"python3 -c '{probe}'").stdout == "True\n"
        assert hog.run(f"python3 -c '{probe}'").stdout == "False\n"  # still held all along
    finally:
        hog.kill()
        other.kill()
