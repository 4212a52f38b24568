"""Quota-limited directories (quota.py) on their own, outside any sandbox."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest
from pydantic import ValidationError

from venusrl.sandbox.quota import make_quota_dir
from venusrl.sandbox.template import Template

MiB = 1 << 20


def _fill(path, chunk: bytes) -> tuple[int, int]:
    """Write `chunk` until the filesystem refuses; returns (bytes written, errno)."""
    written = 0
    with open(path, "wb", buffering=0) as f:
        try:
            while written < 1 << 30:
                written += f.write(chunk)
                os.fsync(f.fileno())
        except OSError as err:
            return written, err.errno
    return written, 0


@pytest.mark.needs_root
def test_writes_stop_at_the_size_and_the_host_pays_at_most_that(tmp_path):
    host_free_before = shutil.disk_usage(tmp_path).free
    quota = make_quota_dir(tmp_path / "q", 16 * MiB, 512)
    try:
        written, code = _fill(quota.path / "big", b"x" * MiB)
        assert code == errno.ENOSPC
        assert 8 * MiB < written <= 16 * MiB
        assert os.stat(quota.image).st_blocks * 512 <= 16 * MiB  # the image is all the host gave
        assert shutil.disk_usage(tmp_path).free > host_free_before - 20 * MiB
        assert quota.usage()["disk_quota_bytes"] <= 16 * MiB
        (quota.path / "big").unlink()
        assert _fill(quota.path / "again", b"y" * MiB)[0] > 8 * MiB  # freed space is usable again
    finally:
        quota.remove()
    assert not os.path.ismount(quota.path) and not quota.image.exists()
    quota.remove()  # twice is fine


@pytest.mark.needs_root
def test_files_stop_at_the_inode_count(tmp_path):
    quota = make_quota_dir(tmp_path / "q", 32 * MiB, 300)
    try:
        created = 0
        with pytest.raises(OSError) as refused:
            for created in range(100_000):  # noqa: B007 - the count is read after the loop
                (quota.path / f"f{created}").touch()
        assert refused.value.errno == errno.ENOSPC
        assert 280 <= created <= quota.usage()["inode_quota"]
    finally:
        quota.remove()


@pytest.mark.needs_root
def test_impossible_limits_name_both_fields(tmp_path):
    with pytest.raises(ValueError, match=r"disk_quota=4194304 bytes with inode_quota=100000"):
        make_quota_dir(tmp_path / "q", 4 * MiB, 100_000)
    assert not (tmp_path / "q.img").exists()


@pytest.mark.needs_root
def test_refuses_a_directory_that_is_not_empty(tmp_path):
    (tmp_path / "q").mkdir()
    (tmp_path / "q" / "old").write_text("x")
    with pytest.raises(ValueError, match="not empty"):
        make_quota_dir(tmp_path / "q", 16 * MiB, 512)


def test_template_quota_fields_are_validated_by_name():
    assert Template(name="t", disk_quota="2GiB").disk_quota == 2 << 30
    with pytest.raises(ValidationError, match="disk_quota"):
        Template(name="t", disk_quota="1MiB")
    with pytest.raises(ValidationError, match="inode_quota"):
        Template(name="t", inode_quota=3)


@pytest.mark.needs_root
def test_mounts_left_by_a_dead_agent_are_released(tmp_path):
    from venusrl.sandbox.quota import release_mounts_under

    quotas = [make_quota_dir(tmp_path / "sandboxes" / name / "layer", 8 * MiB, 128) for name in ("a", "b c")]
    assert all(os.path.ismount(q.path) for q in quotas)
    assert release_mounts_under(tmp_path / "sandboxes") == 2
    assert not any(os.path.ismount(q.path) for q in quotas)
    assert release_mounts_under(tmp_path / "sandboxes") == 0


@pytest.mark.needs_root
def test_spares_are_made_ahead_each_its_own_filesystem(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    from venusrl.sandbox.quota import SpareQuotaDirs

    worker = ThreadPoolExecutor(max_workers=1)
    spares = SpareQuotaDirs(tmp_path / "spare", tmp_path / "blanks", worker.submit, keep=2)
    taken = []
    try:
        taken.append(spares.take(tmp_path / "sb" / "first", 8 * MiB, 128))  # none ready: made on the spot
        worker.submit(lambda: None).result()  # the worker has made the two spares
        assert len(list((tmp_path / "spare").iterdir())) == 2
        taken += [spares.take(tmp_path / "sb" / name, 8 * MiB, 128) for name in ("second", "third")]
        for quota in taken:
            assert os.path.ismount(quota.path) and quota.path.parent.parent == tmp_path / "sb"
        (taken[1].path / "only-here").write_text("x")
        assert not (taken[2].path / "only-here").exists()
        assert _fill(taken[1].path / "big", b"x" * MiB)[1] == errno.ENOSPC
        assert _fill(taken[2].path / "big", b"x" * MiB)[0] > 4 * MiB  # its neighbour's full disk is not its own
    finally:
        worker.shutdown(wait=True)
        spares.close()
        for quota in taken:
            quota.remove()
    assert not list((tmp_path / "spare").iterdir())
    mount_points = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    assert not [p for p in mount_points if p.startswith(str(tmp_path))]


def test_a_published_blank_image_is_never_replaced(tmp_path, monkeypatch):
    """Two sandboxes starting at once may both format the blank image of one (size, inodes):
    the first one published stays in place (another sandbox may be copying it, and `cp`
    refuses a source replaced under it), the later one is dropped."""
    from venusrl.sandbox import quota

    blanks, published = tmp_path / "blanks", []
    real_format = quota._format

    def format_while_another_maker_publishes(image, size, inodes):
        real_format(image, size, inodes)
        if not published:  # the other maker publishes between this one's check and its publish
            other = tmp_path / "other.img"
            real_format(other, size, inodes)
            os.link(other, blanks / f"ext4-{size}-{inodes}.img")
            published.append(os.stat(other).st_ino)

    monkeypatch.setattr(quota, "_format", format_while_another_maker_publishes)
    blank = quota._blank(blanks, 16 * MiB, 512)
    assert os.stat(blank).st_ino == published[0]
    assert [p.name for p in blanks.iterdir()] == [blank.name], "the later maker's image is gone"
