"""Unpacking one image layer into an overlayfs lower directory.

The OCI whiteouts become overlayfs's own: `.wh.NAME` a character device 0/0 at NAME,
`.wh..wh..opq` the `trusted.overlay.opaque=y` xattr on its directory, so the kernel
merges the layers exactly as the image spec says. Owners are shifted by `UID_BASE`: image
uid u is host uid UID_BASE+u, which the sandbox's user namespace maps back to u, so image
files keep their owners inside and no host uid outside the range owns any of them.

The unpacker is written for hostile archives: no entry may leave the layer directory
(`..`, absolute paths, a path through a symlink of the same layer, a hard link to outside),
and the stream's digests must match the ones the image names.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import stat
import subprocess
import tarfile
import threading
import zlib
from pathlib import Path, PurePosixPath
from typing import IO, Any

from venusrl.sandbox.image.formats import ImageError, LayerBlob

UID_BASE = 1 << 20  # image uid u <-> host uid UID_BASE + u (sandboxes' user namespaces map 65536 ids)
UID_COUNT = 65536
OPAQUE_XATTR = "trusted.overlay.opaque"
_WHITEOUT = ".wh."
_OPAQUE = ".wh..wh..opq"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


class _Hashing:
    """A read-only stream that hashes what passes through it."""

    def __init__(self, inner: IO[bytes]) -> None:
        self.inner, self.hash, self.size = inner, hashlib.sha256(), 0

    def read(self, n: int = -1) -> bytes:
        data = self.inner.read(n)
        self.hash.update(data)
        self.size += len(data)
        return data

    def drain(self) -> None:
        while self.read(1 << 20):
            pass

    def digest(self) -> str:
        return "sha256:" + self.hash.hexdigest()


def unpack_layer(blob: LayerBlob, dest: Path) -> dict[str, int]:
    """Unpack `blob` into the empty directory `dest`; returns counts for the store's record."""
    with blob.open() as f:
        head = f.read(4)
    with blob.open() as raw:
        stored = _Hashing(raw)
        if head == _ZSTD_MAGIC:
            decompressed: Any = _Zstd(stored, blob.where)
        elif head[:2] == b"\x1f\x8b":
            decompressed = gzip.GzipFile(fileobj=stored)  # type: ignore[arg-type]
        else:
            decompressed = stored
        plain = _Hashing(decompressed)
        try:
            counts = _unpack_tar(plain, dest, blob.where)
            plain.drain()
            if isinstance(decompressed, _Zstd):
                decompressed.finish()
            stored.drain()
        except (EOFError, zlib.error, gzip.BadGzipFile) as err:
            raise ImageError(f"{blob.where}: the layer is truncated or corrupt ({err})") from None
        finally:
            if isinstance(decompressed, _Zstd):
                decompressed.close()
    if plain.digest() != blob.diff_id:
        raise ImageError(f"{blob.where}: the uncompressed layer is {plain.digest()}, the config says {blob.diff_id}")
    if blob.digest is not None and stored.digest() != blob.digest:
        raise ImageError(f"{blob.where}: the layer blob is {stored.digest()}, the manifest says {blob.digest}")
    counts["bytes"] = plain.size
    return counts


class _Zstd:
    """A zstd stream decompressed by the `zstd` program (Python 3.11 has no zstd); a thread
    feeds it the stored bytes, so they are hashed as they go."""

    def __init__(self, source: _Hashing, where: str) -> None:
        if shutil.which("zstd") is None:
            raise ImageError(f"{where}: a zstd-compressed layer needs the zstd program (`make system-deps`)")
        self.where = where
        self.process = subprocess.Popen(["zstd", "-dcq"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE)
        self.feeder = threading.Thread(target=self._feed, args=(source,), name="zstd-feed", daemon=True)
        self.feeder.start()

    def _feed(self, source: _Hashing) -> None:
        assert self.process.stdin is not None
        try:
            while chunk := source.read(1 << 20):
                self.process.stdin.write(chunk)
        except BrokenPipeError:
            pass  # zstd stopped (corrupt input): finish() reports it
        finally:
            self.process.stdin.close()

    def read(self, n: int = -1) -> bytes:
        assert self.process.stdout is not None
        return self.process.stdout.read(n)

    def close(self) -> None:
        """Stop zstd if the unpacking stopped early; its feeder then ends on a broken pipe."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.feeder.join()
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()

    def finish(self) -> None:
        self.feeder.join()
        assert self.process.stdout is not None and self.process.stderr is not None
        self.process.stdout.close()
        if self.process.wait() != 0:
            raise EOFError(f"zstd: {self.process.stderr.read().decode(errors='replace').strip()}")


def _unpack_tar(stream: _Hashing, dest: Path, where: str) -> dict[str, int]:
    counts = {"files": 0, "whiteouts": 0, "skipped_devices": 0}
    directory_times: list[tuple[Path, float]] = []
    try:
        with tarfile.open(fileobj=stream, mode="r|") as tar:  # type: ignore[call-overload]
            while (member := _next(tar)) is not None:
                _unpack_member(tar, member, dest, where, counts, directory_times)
    except tarfile.TarError as err:
        raise ImageError(f"{where}: not a valid layer tar ({err})") from None
    for path, mtime in reversed(directory_times):  # children first: adding one changes the mtime
        os.utime(path, (mtime, mtime), follow_symlinks=False)
    return counts


def _next(tar: tarfile.TarFile) -> tarfile.TarInfo | None:
    try:
        return tar.next()
    except tarfile.ReadError as err:
        # Some writers (umoci 0.4) end the archive without its two zero blocks, or even the
        # last block's padding; Go's reader accepts that, and the diff_id still covers every byte.
        if str(err) == "unexpected end of data":
            return None
        raise


def _unpack_member(tar: tarfile.TarFile, member: tarfile.TarInfo, dest: Path, where: str,
                   counts: dict[str, int], directory_times: list[tuple[Path, float]]) -> None:
    parts = _parts(member.name, where)
    if not parts:  # the layer's root directory itself
        return
    parent = _directory(dest, parts[:-1], where)
    name = parts[-1]
    if name == _OPAQUE:
        os.setxattr(parent, OPAQUE_XATTR, b"y")
        counts["whiteouts"] += 1
        return
    if name.startswith(_WHITEOUT):
        target = parent / name[len(_WHITEOUT):]
        if os.path.lexists(target):
            return  # a whiteout hides lower layers only, never an entry of its own layer
        os.mknod(target, stat.S_IFCHR, os.makedev(0, 0))
        counts["whiteouts"] += 1
        return
    target = parent / name
    uid, gid = _shift(member.uid, where, member.name), _shift(member.gid, where, member.name)
    if member.isdir():
        if not target.is_dir() or target.is_symlink():
            _remove(target)
            target.mkdir()
        directory_times.append((target, member.mtime))
    else:
        _remove(target)
        if member.isreg():
            source = tar.extractfile(member)
            assert source is not None
            with open(target, "xb") as out:
                shutil.copyfileobj(source, out, 1 << 20)
        elif member.issym():
            os.symlink(member.linkname, target)
        elif member.islnk():
            linked = dest.joinpath(*_parts(member.linkname, where))
            _directory(dest, _parts(member.linkname, where)[:-1], where)
            if not linked.is_file() or linked.is_symlink():
                raise ImageError(f"{where}: {member.name}: hard link to {member.linkname}, not a file of this layer")
            os.link(linked, target)
            return  # a hard link shares its target's inode, owner and mode
        elif member.isfifo():
            os.mkfifo(target)
        else:  # devices: a sandbox's /dev is its own and its root is mounted nodev
            counts["skipped_devices"] += 1
            return
    counts["files"] += 1
    os.chown(target, uid, gid, follow_symlinks=False)
    if not member.issym():
        os.chmod(target, member.mode & 0o7777)
        if not member.isdir():
            os.utime(target, (member.mtime, member.mtime))


def _parts(name: str, where: str) -> tuple[str, ...]:
    parts = tuple(p for p in PurePosixPath(name.lstrip("/")).parts if p != ".")
    if ".." in parts:
        raise ImageError(f"{where}: entry {name!r} leaves the layer ('..')")
    return parts


def _directory(dest: Path, parts: tuple[str, ...], where: str) -> Path:
    """`dest/parts`, created as needed, never through a symlink."""
    path = dest
    for part in parts:
        path = path / part
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            path.mkdir()
            os.chown(path, UID_BASE, UID_BASE)
            continue
        if stat.S_ISLNK(mode):
            raise ImageError(f"{where}: an entry below {'/'.join(parts)} goes through a symlink of the same layer")
        if not stat.S_ISDIR(mode):
            raise ImageError(f"{where}: {'/'.join(parts)} is used as a directory but is a file")
    return path


def _remove(path: Path) -> None:
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def _shift(uid: int, where: str, name: str) -> int:
    if not 0 <= uid < UID_COUNT:
        raise ImageError(f"{where}: {name}: owner id {uid} is outside the {UID_COUNT} ids a sandbox maps")
    return UID_BASE + uid
