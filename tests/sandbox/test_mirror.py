"""The incremental mirror behind exactly-once snapshots: after any sequence of changes, the
copy is exact, including changes made in the same clock tick as the previous copy."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from venusrl.sandbox.mirror import mirror

NAMES = st.sampled_from(["a", "b", "c"])
PATHS = st.lists(NAMES, min_size=1, max_size=3).map(lambda parts: "/".join(parts))
OPS = st.one_of(
    st.tuples(st.just("write"), PATHS, st.binary(max_size=3)),  # same-size rewrites happen often
    st.tuples(st.just("mkdir"), PATHS, st.none()),
    st.tuples(st.just("remove"), PATHS, st.none()),
    st.tuples(st.just("chmod"), PATHS, st.sampled_from([0o600, 0o755])),
    st.tuples(st.just("whiteout"), PATHS, st.none()),
    st.tuples(st.just("opaque"), PATHS, st.booleans()),
    st.tuples(st.just("mirror"), st.none(), st.none()),
)


def _apply(root: Path, op: str, rel: str, arg) -> None:
    path = root / rel
    if not path.parent.is_dir():
        return
    exists = path.exists() or path.is_symlink()
    if op == "write" and not path.is_dir():
        if exists and not path.is_file():
            path.unlink()
        with open(path, "wb") as f:  # in place, as overlayfs writes to an upper file
            f.write(arg)
    elif op == "mkdir" and not exists:
        path.mkdir()
    elif op == "remove" and exists:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    elif op == "chmod" and exists:
        os.chmod(path, arg)
    elif op == "whiteout" and not exists:
        os.mknod(path, stat.S_IFCHR, os.makedev(0, 0))
    elif op == "opaque" and path.is_dir():
        if arg:
            os.setxattr(path, "trusted.overlay.opaque", b"y")
        elif "trusted.overlay.opaque" in os.listxattr(path):
            os.removexattr(path, "trusted.overlay.opaque")


def _tree(root: Path) -> dict[str, tuple]:
    found = {}
    for path in sorted(root.rglob("*")):
        st_ = os.lstat(path)
        content = path.read_bytes() if stat.S_ISREG(st_.st_mode) else b""
        xattrs = {n: os.getxattr(path, n) for n in os.listxattr(path, follow_symlinks=False)}
        found[str(path.relative_to(root))] = (st_.st_mode, st_.st_uid, st_.st_rdev, content, xattrs, st_.st_mtime_ns)
    return found


@settings(max_examples=60, deadline=None)
@given(st.lists(OPS, max_size=25))
def test_the_mirror_is_exact_after_any_changes(ops):
    with tempfile.TemporaryDirectory() as tmp:
        src, dst, stamp = Path(tmp) / "src", Path(tmp) / "dst", Path(tmp) / "stamp"
        src.mkdir()
        for op, rel, arg in [*ops, ("mirror", None, None)]:
            if op == "mirror":
                mirror([(src, dst)], stamp)
                assert _tree(src) == _tree(dst)
            else:
                _apply(src, op, rel, arg)


def test_unchanged_files_are_not_copied_again(tmp_path):
    src, dst, stamp = tmp_path / "src", tmp_path / "dst", tmp_path / "stamp"
    (src / "d").mkdir(parents=True)
    for i in range(20):
        (src / "d" / f"f{i}").write_text("x" * i)
    old = 1_000_000_000  # long settled
    for path in (src / "d").iterdir():
        os.utime(path, ns=(old, old))
    assert mirror([(src, dst)], stamp) == 21
    assert mirror([(src, dst)], stamp) == 0
    (src / "d" / "f3").write_text("yyy")  # same size, new content
    assert mirror([(src, dst)], stamp) == 1
    assert (dst / "d" / "f3").read_text() == "yyy"
