"""What a sandbox takes from an image config (the OCI `config` object, which docker-archive
shares): Env, WorkingDir, User, Entrypoint and Cmd, and the user's uid, gid and home
resolved from the image's own /etc/passwd and /etc/group."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from venusrl.sandbox.image.formats import ImageError

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class ImageRecord:
    """An imported image, as the store keeps it (`images/NAME.json`)."""

    name: str
    image_id: str  # digest of the config blob
    layers: tuple[str, ...]  # diff_ids, bottom first
    env: tuple[str, ...]
    working_dir: str
    user: str
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]
    format: str
    source: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ImageRecord:
        data = dict(data)
        for key in ("layers", "env", "entrypoint", "cmd"):
            data[key] = tuple(data[key])
        return cls(**data)

    @property
    def command(self) -> tuple[str, ...]:
        """Entrypoint followed by Cmd: what `docker run IMAGE` would start."""
        return self.entrypoint + self.cmd


def record_from_config(name: str, image_id: str, layers: tuple[str, ...], config: dict[str, Any],
                       fmt: str, source: str) -> ImageRecord:
    run = config.get("config") or {}
    where = f"image {name}: config"
    env = run.get("Env") or []
    if not isinstance(env, list) or not all(isinstance(e, str) and "=" in e for e in env):
        raise ImageError(f"{where}.Env: expected a list of 'NAME=value' strings, got {env!r}")
    working_dir = run.get("WorkingDir") or "/"
    if not isinstance(working_dir, str) or not working_dir.startswith("/"):
        raise ImageError(f"{where}.WorkingDir: expected an absolute path, got {working_dir!r}")
    user = run.get("User") or ""
    if not isinstance(user, str):
        raise ImageError(f"{where}.User: expected a string, got {user!r}")
    command = {}
    for key in ("Entrypoint", "Cmd"):
        value = run.get(key) or []
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ImageError(f"{where}.{key}: expected a list of strings, got {value!r}")
        command[key] = tuple(value)
    return ImageRecord(name, image_id, layers, tuple(env), working_dir, user, command["Entrypoint"], command["Cmd"],
                       fmt, source)


@dataclass(frozen=True)
class ImageUser:
    uid: int
    gid: int
    name: str
    home: str


def resolve_user(user: str, passwd: str, group: str, image: str) -> ImageUser:
    """Docker's rules: `NAME`, `UID`, `NAME:GROUP` or `UID:GID`; empty means root. A name
    must be in the image's /etc/passwd; a bare number need not be."""
    name_part, _, group_part = (user or "root").partition(":")
    users = _table(passwd)
    if name_part.isdigit():
        uid = int(name_part)
        entry = next((e for e in users.values() if e[1] == str(uid)), None)
        name, gid, home = (entry[0], int(entry[2]), entry[4]) if entry else (name_part, uid, "/")
    else:
        entry = users.get(name_part)
        if entry is None:
            if name_part == "root":
                entry = ("root", "0", "0", "", "/root")
            else:
                raise ImageError(f"image {image}: User {user!r}: no user {name_part!r} in the image's /etc/passwd")
        name, uid, gid, home = entry[0], int(entry[1]), int(entry[2]), entry[4]
    if group_part:
        if group_part.isdigit():
            gid = int(group_part)
        else:
            found = _table(group).get(group_part)
            if found is None:
                raise ImageError(f"image {image}: User {user!r}: no group {group_part!r} in the image's /etc/group")
            gid = int(found[1])
    return ImageUser(uid, gid, name, home or "/")


def _table(text: str) -> dict[str, tuple[str, ...]]:
    """name -> (name, id, gid-or-members, ...) for passwd (fields 0, 2, 3, 4, 5) and group."""
    rows = {}
    for line in text.splitlines():
        fields = line.split(":")
        if len(fields) >= 7:  # passwd: name:x:uid:gid:gecos:home:shell
            rows[fields[0]] = (fields[0], fields[2], fields[3], fields[4], fields[5])
        elif len(fields) >= 3 and fields[2].isdigit():  # group: name:x:gid:members
            rows[fields[0]] = (fields[0], fields[2])
    return rows


def session_environment(record: ImageRecord, user: ImageUser) -> dict[str, str]:
    """The environment commands start with: the image's Env over what a login would set."""
    env = {"PATH": DEFAULT_PATH, "HOME": user.home, "USER": user.name, "LANG": "C.UTF-8", "TERM": "dumb"}
    for pair in record.env:
        key, _, value = pair.partition("=")
        env[key] = value
    return env
