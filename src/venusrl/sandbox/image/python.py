"""Which Python interpreter an image has, found in its files (no process started): the
image config's PATH, then the usual install places. Its version is the image's own and
may differ from the host's; the image zygote reports it (forkserver.py refuses < 3.8)."""

from __future__ import annotations

import os
import re
import stat

from venusrl.sandbox.image.config import DEFAULT_PATH, ImageRecord
from venusrl.sandbox.image.store import ImageStore

NAMES = ("python3", "python")
PLACES = ("/usr/local/bin", "/usr/bin")
_VERSIONED = re.compile(r"^python3\.\d+$")


def image_path(record: ImageRecord) -> list[str]:
    env = dict(pair.partition("=")[::2] for pair in record.env)
    return [d for d in env.get("PATH", DEFAULT_PATH).split(":") if d.startswith("/")]


def find_python(store: ImageStore, record: ImageRecord) -> str | None:
    """The image path of its Python (as a shell in the image would find it), or None."""
    candidates = [f"{d.rstrip('/')}/{n}" for d in image_path(record) for n in NAMES]
    for place in PLACES:
        real = store.realpath(record, place)
        if real is not None and store.resolve(record, real).is_dir():
            versioned = sorted((n for n in store.list_dir(record, real) if _VERSIONED.match(n)),
                               key=lambda n: int(n.split(".")[1]), reverse=True)
            candidates += [f"{place}/{n}" for n in versioned]
    for candidate in candidates:
        found = store.resolve(record, candidate)
        if found is not None and stat.S_ISREG(os.stat(found).st_mode) and os.stat(found).st_mode & 0o111:
            return candidate
    return None

