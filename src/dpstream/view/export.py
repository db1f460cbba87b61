"""Writing ``dpstream view --export REPORT.html``: a new file, or an earlier export, never another.

Layer 6 of dpstream (an edge). The export replaces only what it wrote itself: a
file at ``REPORT.html`` (the file a symbolic link there leads to) must be an
earlier export of the view, recognised by its first bytes
(:data:`EXPORT_MARKER`, or the page's own head as versions before it wrote
it), else it is refused, as ``dpstream run`` refuses an output that is another
file: a key, a ledger or a state file overwritten with HTML is lost for good.
The releases file and its metadata file are refused in any case, whatever
name leads to them.

The page goes to a temporary file beside the target, then replaces it in one
rename, so a crash (or a full disk) leaves the earlier export whole.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import stat
from pathlib import Path

from ..run.lock import refuse_foreign_link, same_file

__all__ = ["EXPORT_MARKER", "is_export", "write_export"]

#: The tag every static export has in the first bytes of its head.
EXPORT_MARKER = '<meta name="generator" content="dpstream view --export">'

#: How much of a file's start is read to tell an export.
_HEAD_BYTES = 1 << 18
#: An export written before the marker: the view's ``<main>`` marked static, in its head.
_OLD_EXPORT = re.compile(rb'<main id="dp-view" data-state="[^"]*" data-static="1">')


def is_export(path: str | os.PathLike[str]) -> bool:
    """Whether the regular file at ``path`` is a static export of the view."""
    with open(path, "rb") as fh:
        head = fh.read(_HEAD_BYTES)
    if not head.startswith(b"<!doctype html>"):
        return False
    return EXPORT_MARKER.encode() in head[:512] or _OLD_EXPORT.search(head) is not None


def write_export(
    out: str | os.PathLike[str], text: str, *, protected: dict[str, str | os.PathLike[str]]
) -> Path:
    """Write ``text`` to ``out`` (atomically) and return the path written.

    ``protected`` names the files never written, by their role (``"the releases
    file"``: its path). Refused (ValueError, naming the file): ``out`` is one of
    them (through any link), or an existing file that is not an earlier export
    (or not a regular file). A symbolic link at ``out`` stays: the file it leads
    to is replaced.
    """
    refuse_foreign_link(str(out), "--export")
    target = os.path.realpath(out)
    for role, path in protected.items():
        if same_file(target, str(path)):
            raise ValueError(f"--export {str(out)!r} is {role}: refusing to overwrite it")
    try:
        info = os.stat(target)
    except FileNotFoundError:
        info = None
    if info is not None:
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"--export {str(out)!r} is not a regular file: refusing to write it")
        if not is_export(target):
            raise ValueError(
                f"--export {str(out)!r} exists and is not a page dpstream view exported: "
                "refusing to overwrite it (move it, or choose a new name)"
            )
    folder, name = os.path.split(target)
    tmp = os.path.join(folder, f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(text.encode("utf-8", "replace"))
            fh.flush()
            os.fsync(fh.fileno())
        if info is not None:  # the earlier export's readers keep reading it
            with contextlib.suppress(OSError):
                os.chmod(tmp, stat.S_IMODE(info.st_mode))
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return Path(out)
