"""Host uid leases: never two live holders of one uid, across allocators (as across node
agents and test runs on one host), and a dead holder's uid comes back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from venusrl.sandbox.errors import AdmissionRefused
from venusrl.sandbox.subuid import DEFAULT_RANGE, UidAllocator, UidRange, probe_order, subuid_range


@given(start=st.integers(1, 10**6), count=st.integers(1, 300), cursor=st.integers(-10**6, 2 * 10**6))
def test_probe_order_visits_every_uid_once_starting_at_the_cursor(start, count, cursor):
    uids = UidRange(start, count)
    order = list(probe_order(uids, cursor))
    assert sorted(order) == list(range(start, start + count))
    assert order[0] == start + (cursor - start) % count


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.tuples(st.integers(0, 2), st.booleans(), st.integers(0, 20)), max_size=60),
       count=st.integers(1, 6))
def test_allocators_sharing_a_lease_dir_never_hand_out_a_uid_twice(tmp_path_factory, ops, count):
    lease_dir = tmp_path_factory.mktemp("leases")
    uids = UidRange(5000, count)
    reserved = frozenset({5001})
    allocators = [UidAllocator(uids, lease_dir, reserved) for _ in range(3)]
    held: list = []
    for which, acquire, pick in ops:
        if acquire or not held:
            free = count - len(reserved & set(range(5000, 5000 + count))) - len(held)
            if free == 0:
                with pytest.raises(AdmissionRefused, match="no free sandbox uid"):
                    allocators[which].acquire()
                continue
            lease = allocators[which].acquire()
            assert lease.uid in uids and lease.uid not in reserved
            held.append(lease)
        else:
            held.pop(pick % len(held)).release()
        live = [lease.uid for lease in held]
        assert len(live) == len(set(live))
        assert sorted(int(p.name) for p in lease_dir.iterdir()) == sorted(live)
    for lease in held:
        lease.release()


def test_a_released_uid_is_reused_last(tmp_path):
    allocator = UidAllocator(UidRange(7000, 3), tmp_path)
    first = allocator.acquire()
    first.release()
    assert [allocator.acquire().uid for _ in range(3)] == [7001, 7002, 7000]


def test_a_dead_holders_uid_is_free_again(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from pathlib import Path; from venusrl.sandbox.subuid import UidAllocator, UidRange\n"
         f"lease = UidAllocator(UidRange(9000, 1), Path({str(tmp_path)!r})).acquire()\n"
         "print(lease.uid, flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert holder.stdout.readline().strip() == "9000"
        mine = UidAllocator(UidRange(9000, 1), tmp_path)
        with pytest.raises(AdmissionRefused):
            mine.acquire()
        holder.send_signal(signal.SIGKILL)  # no release: the kernel drops its lock
        holder.wait()
        assert mine.acquire().uid == 9000
    finally:
        holder.kill()


def test_subuid_file_gives_the_range_and_bad_lines_name_the_line(tmp_path):
    path = tmp_path / "subuid"
    assert subuid_range(path) == DEFAULT_RANGE
    path.write_text("alice:100000:65536\nvenusrl:300000:1000\n")
    assert subuid_range(path) == UidRange(300000, 1000)
    path.write_text("alice:100000:65536\nvenusrl:lots\n")
    with pytest.raises(ValueError, match=r"subuid:2: 'venusrl:lots'"):
        subuid_range(path)
    with pytest.raises(ValueError, match="must lie in"):
        UidRange(0, 10)


def test_lease_files_are_not_world_writable(tmp_path):
    lease = UidAllocator(UidRange(4000, 2), tmp_path / "d").acquire()
    try:
        assert Path(lease.path).stat().st_mode & 0o077 == 0
    finally:
        lease.release()
    assert not Path(lease.path).exists()
