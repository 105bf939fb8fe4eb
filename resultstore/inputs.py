"""One bounded reader for every file a user hands the tools (a spec, a lock, a corpus's head):
what it reads, and what it refuses, each named in one line.

    kind   only a regular file is read. A folder, a FIFO (it would block forever), a socket,
           a character or block device (/dev/zero never ends), a symlink loop and a link to
           nothing are named as what they are
    size   at most `max_bytes` (a spec: SPEC_MAX_BYTES); a larger file is refused unread
    time   at most `max_seconds` (READ_SECONDS) of reading: a stalled network mount is named,
           not waited on
    text   UTF-8 with no control characters but tab, newline and carriage return (YAML's own
           rule); the first one is named with its line and column

Every verb reads its inputs through here, so the same file gets the same verdict everywhere.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import threading
from pathlib import Path

__all__ = ["READ_SECONDS", "SPEC_MAX_BYTES", "InputError", "file_kind", "read_bytes", "read_text", "require_file"]

SPEC_MAX_BYTES = 256 << 10
"""A spec is hand-written (this repository's largest is under 3 KiB); 256 KiB parses in about a second."""
READ_SECONDS = 10.0
"""The longest one read may take before it is refused (a local file takes milliseconds)."""

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))
_NOT_PRINTABLE = re.compile("[^\x09\x0a\x0d\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
"""What YAML (and so this reader) refuses in text: control characters, unpaired surrogates, U+FFFE/F."""


class InputError(ValueError):
    """An input that cannot be read as asked (one line, naming the path and why)."""


def file_kind(path: str | os.PathLike[str]) -> str:
    """What `path` is: "a file", "a folder", "a FIFO (named pipe)", "a socket", "a character
    device", "a block device", "a symlink loop", "a link to nothing (-> target)", "missing",
    or "unreadable (why)". Never blocks and never reads."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "a symlink loop"
        if exc.errno == errno.ENOENT and os.path.islink(path):
            return f"a link to nothing (-> {os.readlink(path)})"
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return "missing"
        return f"unreadable ({exc.strerror or exc})"
    if stat.S_ISREG(mode):
        return "a file"
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def require_file(path: str | os.PathLike[str], what: str = "file") -> Path:
    """`path` as a Path when it is a regular file (through links), else InputError naming what it is."""
    kind = file_kind(path)
    if kind == "a file":
        return Path(path)
    if kind == "missing":
        raise InputError(f"{path}: no such {what}")
    if kind.startswith("unreadable"):
        raise InputError(f"{path}: cannot read the {what}: {kind.removeprefix('unreadable (').rstrip(')')}")
    raise InputError(f"{path}: is {kind}, not a {what}")


def read_bytes(path: str | os.PathLike[str], *, max_bytes: int, what: str = "file",
               max_seconds: float = READ_SECONDS) -> bytes:
    """The whole file, when it is a regular file of at most `max_bytes` read within `max_seconds`."""
    require_file(path, what)
    result: list = []

    def read() -> None:
        try:  # O_NONBLOCK: a FIFO swapped in after the check above still cannot block the open
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            with os.fdopen(fd, "rb") as f:
                if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                    raise InputError(f"{path}: is not a regular file any more; not a {what}")
                result.append(f.read(max_bytes + 1))
        except BaseException as exc:  # re-raised in the caller's thread
            result.append(exc)

    reader = threading.Thread(target=read, daemon=True, name="bounded-read")
    reader.start()
    reader.join(max_seconds)
    if reader.is_alive():
        raise InputError(f"{path}: reading the {what} took over {max_seconds:g} s (a stalled mount?); nothing was read")
    data = result[0]
    if isinstance(data, InputError):
        raise data
    if isinstance(data, OSError):
        raise InputError(f"{path}: cannot read the {what}: {data.strerror or data}") from None
    if isinstance(data, BaseException):
        raise data
    if len(data) > max_bytes:
        size = os.stat(path).st_size
        raise InputError(f"{path}: {_size(size)} is over the {_size(max_bytes)} a {what} may hold")
    return data


def read_text(path: str | os.PathLike[str], *, max_bytes: int, what: str = "file",
              max_seconds: float = READ_SECONDS) -> str:
    """The file as UTF-8 text (see read_bytes), refused with its line and column when it holds a
    byte that is not UTF-8 or a control character."""
    raw = read_bytes(path, max_bytes=max_bytes, what=what, max_seconds=max_seconds)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise InputError(f"{path}: line {line}: not UTF-8 text (byte 0x{raw[exc.start]:02x}); "
                         f"save the {what.removesuffix(' file')} as UTF-8") from None
    bad = _NOT_PRINTABLE.search(text)
    if bad is not None:
        line = text.count("\n", 0, bad.start()) + 1
        column = bad.start() - (text.rfind("\n", 0, bad.start()) + 1) + 1
        raise InputError(f"{path}: line {line}, column {column}: control character U+{ord(bad.group()):04X} "
                         f"({bad.group()!r}); a {what} holds printable text, tabs and newlines only")
    return text


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} bytes"
