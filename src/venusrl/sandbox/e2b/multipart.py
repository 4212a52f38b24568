"""A multipart/form-data body's file parts, parsed exactly (binary-safe, no line ending
rewritten): what the SDK's `files.write` uploads. The standard library's email parser
would guess at encodings; python-multipart is not a dependency."""

from __future__ import annotations

import re

from venusrl.sandbox.e2b.errors import RestError

_BOUNDARY = re.compile(r'boundary="?([^";]+)"?')
_FILENAME = re.compile(rb'filename="((?:[^"\\]|\\.)*)"')


def parse_multipart(body: bytes, content_type: str) -> list[tuple[str, bytes]]:
    """(filename, content) of each part, in order."""
    found = _BOUNDARY.search(content_type)
    if found is None:
        raise RestError(400, "Content-Type: multipart/form-data without a boundary")
    delimiter = b"--" + found.group(1).encode()
    sections = body.split(b"\r\n" + delimiter)
    first = sections[0]
    if not first.startswith(delimiter):
        raise RestError(400, "body: multipart body does not start with its boundary")
    sections[0] = first[len(delimiter):]
    parts = []
    for section in sections:
        if section.startswith(b"--"):  # the closing delimiter
            break
        head, sep, content = section.partition(b"\r\n\r\n")
        if not sep:
            raise RestError(400, "body: a multipart part has no header/body separator")
        name = _FILENAME.search(head)
        parts.append(((name.group(1).decode(errors="replace") if name else ""), content))
    else:
        raise RestError(400, "body: multipart body has no closing boundary")
    if not parts:
        raise RestError(400, "file: the multipart body holds no file")
    return parts
