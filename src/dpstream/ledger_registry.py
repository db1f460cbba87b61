"""Which ledger a key's releases are recorded in, kept per user so a copy of the key finds it.

Layer 6 of dpstream (the edges); stdlib, the key and :func:`dpstream.run.lock.same_file`.

Without ``--ledger`` a key's release ledger lives beside the file the key's path
resolves to (:func:`dpstream.ledger.default_ledger_path`). A copy of the key file (or
a hard link, or the same key saved again elsewhere) resolves to another file, so it
found a fresh, empty ledger: the replay refusal and the budget cap were both blind to
what the first ledger held, and a run from the copy could release a used noise scope
again from other data (the difference of two such releases is the exact difference of
the true counts).

So the ledger a key is first used with is recorded in a small per-user registry,
under the key's public fingerprint (:meth:`dpstream.noise.NoiseKey.fingerprint`, a
keyed digest: the registry holds no secret): a file
``$DPSTREAM_KEY_REGISTRY/<fingerprint>`` (default ``$XDG_STATE_HOME/dpstream/keys``,
else ``~/.local/state/dpstream/keys``) holding the ledger's path. The rules:

* A run records its ledger, the default one or the one ``--ledger`` names, when the
  key has no recorded ledger, or its recorded ledger is gone (no such file in a folder
  that exists) and the ledger given holds releases (a copy made before it went). A
  recorded ledger that is gone with no ledger holding releases in its place is refused,
  in every command: a new, empty ledger would not know the key's releases (it was a
  warning, and a ledger moved with ``mv`` and run without its new ``--ledger`` started
  afresh). Removing the registry entry is the deliberate way to forget them. A run
  creates its ledger while it holds the registry's lock for the key, so two first runs
  from two copies cannot both record. ``plan`` and ``budget`` record a ledger only if
  it exists already (so running ``dpstream budget --key-file KEY`` after an upgrade
  records a key's ledger).
* The entry also names the key file the ledger was recorded from (for the advice). A
  run with any other ledger, while the recorded one exists or cannot be reached, is
  refused before anything is written: the default ledger of a copy of the key, the
  default ledger of the key file that was given ``--ledger`` (a forgotten flag), and a
  ``--ledger`` naming another file (reviews 106 and 107: each found a ledger blind to
  the key's releases, so the replay refusal and the dataset's cap saw nothing, and the
  same noise went out over other data). Only a ledger that is certainly gone may be
  replaced (above): no file in a folder that exists on the file system it was recorded on
  (the entry keeps the ledger's device and inode and its folder's device: the bare
  mount point of an unmounted volume is not its folder, review 108). A ledger moved
  (``mv``, or its folder renamed) is found by its device and inode at its new path,
  and the record follows it. ``DPSTREAM_KEY_REGISTRY=off`` is the way to keep two
  ledgers of one key on purpose. A registry that exists but cannot be written is
  still read (its entries hold), with a warning.
* The entry keeps the ledger's mark: the size of whole lines a run of the key left it
  at (raised when a run that appended closes it) and a digest of the bytes just before
  that size. A ledger only grows, so a file shorter than that, or with other bytes
  before it, at the recorded path or taken in its place when it is gone, is a ledger
  rolled back (a backup put back with ``cp`` or ``mv``, at its path or another, and
  perhaps grown since by another key's runs on a shared ledger; reviews 113 and 116: it
  forgot the runs recorded since, and a capped run passed its cap): refused in every
  command, until the entry is removed on purpose. The file's device and inode are not
  compared (they change when a volume is mounted again).

The registry is per user and per machine: a key copied to another machine or used by
another user is not seen (docs/operations.md says to name one ledger on shared storage
with ``--ledger`` there). ``DPSTREAM_KEY_REGISTRY=off`` turns it off; a relative path
there is refused (the registry would change with the working folder), and a relative
``XDG_STATE_HOME`` is ignored, as its specification says. A registry that cannot be
written (a read-only home) is logged once and the run goes on: it is a guard against a
mistake, and the ledger itself is unchanged.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import stat
import tempfile
from collections.abc import Iterator
from typing import TYPE_CHECKING

from .errors import LedgerError
from .run.lock import same_file

if TYPE_CHECKING:
    from .noise import NoiseKey

__all__ = ["ENV", "check_ledger", "registry_dir"]

#: The environment variable that names the registry's directory (``off``: none).
ENV = "DPSTREAM_KEY_REGISTRY"

_LOG = logging.getLogger("dpstream")

#: The most of an entry read: two paths (a longer entry is not one this module wrote).
_ENTRY_MAX = 64 * 1024


def registry_dir() -> str | None:
    """The registry's directory, or ``None`` when turned off (``DPSTREAM_KEY_REGISTRY=off``).

    Raises:
        LedgerError: ``DPSTREAM_KEY_REGISTRY`` is a relative path.
    """
    chosen = os.environ.get(ENV)
    if chosen == "off":
        return None
    if chosen:
        chosen = os.path.expanduser(chosen)
        if not os.path.isabs(chosen):
            raise LedgerError(
                f"{ENV}={chosen!r} is a relative path: the key registry would depend on "
                "the working folder; give an absolute path (or off)"
            )
        return chosen
    state = os.environ.get("XDG_STATE_HOME") or ""
    if not os.path.isabs(state):  # unset, empty or relative: the default
        state = os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(state, "dpstream", "keys")


def check_ledger(
    key: NoiseKey,
    ledger: str,
    key_file: str | None,
    *,
    default: bool,
    record: bool,
    wait: bool = True,
) -> None:
    """Refuse ``ledger`` (``default``: the one beside ``key_file``; else named) when the
    key's recorded ledger is another file that exists or cannot be reached; record
    ``ledger`` when the key has none (see the module's rules). ``record``: a run, which
    creates its ledger here (:func:`dpstream.ledger_file.check_ledger_file`) under the
    registry's lock; without it (``plan``, ``budget``) only an existing ledger is
    recorded. ``key_file``: None for a key given as an object (a library's Spark
    stream, whose ``ledger=`` is always named, as ``--ledger`` is).

    Raises:
        LedgerError: the key's releases are recorded in another ledger.
    """
    folder = registry_dir()
    if folder is None or not _make_folder(folder):
        return
    entry = os.path.join(folder, key.fingerprint())
    given, ledger = ledger, os.path.realpath(ledger)
    key_file_real = "" if key_file is None else os.path.realpath(key_file)
    with _entry_lock(entry, wait) as locked:
        if not locked:  # another process holds the entry: checked later, by a run once
            return  # its batch is marked as begun (review 110)
        recorded, recorded_key, ids, mark = _read(entry)
        state = _state(recorded, ids) if recorded is not None else "gone"
        if recorded is not None and state != "live" and _moved_here(ids, ledger):
            # the recorded ledger itself, moved here (its folder renamed, or `mv`): the
            # record follows it (review 108: a renamed folder was taken for an
            # unmounted volume, and refused)
            if record:
                _write(entry, ledger, key_file_real, mark)
            return
        if recorded is not None and (
            state == "unreachable" or (state == "live" and not same_file(recorded, ledger))
        ):
            # one ledger a key (reviews 106 and 107): a copy of the key, its own key file
            # without the --ledger it was given, or a --ledger naming a fresh file found a
            # ledger blind to the key's releases, so the replay refusal and the dataset's
            # cap saw nothing, and the same noise went out over other data
            raise LedgerError(
                _refusal(recorded, ledger, key_file, entry, state, recorded_key, default)
            )
        if recorded is not None and state == "gone" and _size(ledger) <= 0:
            # a recorded ledger deleted or moved away, and no ledger here: a new, empty
            # one would not know the key's releases, so a stream it recorded could go
            # out again over other data under the same noise (it was a warning, and a
            # ledger moved with `mv` and run without --ledger started afresh)
            raise LedgerError(_gone(recorded, key_file, entry))
        if recorded is not None and _rolled_back(ledger, mark):
            # the file at the recorded path, or the one taken for it when the recorded
            # one is gone, is shorter than a run of the key left the ledger, or holds
            # other bytes before that mark (review 113: a ledger put back from a backup
            # forgot the releases made since, and a capped run passed its cap; review
            # 116: put back at a new path, or grown since by another key's runs)
            raise LedgerError(_replaced(recorded, ledger, key_file, entry))
        if recorded is not None and state == "live":
            if ids is None and record:  # an older dpstream's entry: its identity added
                _write(entry, ledger, recorded_key or key_file_real, mark)
            return  # this ledger, on record
        if record:
            from .ledger_file import check_ledger_file

            check_ledger_file(given)  # exists before the entry names it (the path as
            # given: its links are checked before they are followed, review 103)
        elif not os.path.isfile(ledger):
            return
        _write(entry, ledger, key_file_real, mark)  # (raised when a run appends)


def note_size(key: NoiseKey, ledger: str, size: int) -> None:
    """Raise the key's mark to ``size``, the bytes of whole lines a run that appended to
    ``ledger`` read and wrote (when it is the key's recorded ledger; never another run's
    torn line, which a later run cuts off), with a digest of the bytes before it: the
    ledger only grows, so a file shorter than that, or with other bytes there, at the
    next run is a ledger rolled back (:func:`_rolled_back`) and is refused. Never raises,
    never waits: a mark not raised only makes the check see less."""
    try:
        folder = registry_dir()
        if folder is None or not os.path.isdir(folder):
            return
        entry = os.path.join(folder, key.fingerprint())
        with _entry_lock(entry, wait=False) as locked:
            if not locked:
                return
            recorded, recorded_key, _, mark = _read(entry)
            if recorded is not None and size > mark[0] and same_file(recorded, ledger):
                _write(entry, recorded, recorded_key or "", (size, _tail(ledger, size)))
    except (LedgerError, OSError):
        return


#: A ledger's mark in the key registry: the size of whole lines a run of the key left
#: it at, and a digest of the bytes just before that size (None: not known).
Mark = tuple[int, "str | None"]
#: the bytes before a mark that its digest covers: the end of the last line at least
_TAIL = 64


def _tail(path: str, size: int) -> str | None:
    """A digest of the :data:`_TAIL` bytes of ``path`` before ``size`` (None: shorter)."""
    want = min(size, _TAIL)
    try:
        with open(path, "rb") as fh:
            fh.seek(size - want)
            data = fh.read(want)
    except OSError:
        return None
    if len(data) < want:
        return None
    return hashlib.sha256(data).hexdigest()[:32]


def _rolled_back(ledger: str, mark: Mark) -> bool:
    """Whether ``ledger`` is not the ledger its mark was taken of: shorter, or other
    bytes before the mark (a backup put back and grown since, by this key's runs or by
    another key's on a shared ledger). A live file's device and inode are not compared:
    they change when a volume is mounted again (review 116)."""
    size, tail = mark
    if size <= 0:
        return False
    if _size(ledger) < size:
        return True
    return tail is not None and _tail(ledger, size) != tail


def _state(recorded: str, ids: tuple[int, int, int] | None) -> str:
    """``live``: a regular file; ``gone``: no such file in a folder that exists, on the
    file system it was recorded on; ``unreachable``: anything else (its folder missing,
    or on another file system now: the bare mount point of an unmounted volume; not a
    file; an error). ``ids``: the ledger's device and inode and its folder's device,
    as recorded (None in an entry of an older dpstream)."""
    try:
        mode = os.stat(recorded).st_mode
    except FileNotFoundError:
        try:
            folder = os.stat(os.path.dirname(recorded))
        except OSError:
            return "unreachable"
        if not stat.S_ISDIR(folder.st_mode):
            return "unreachable"
        if ids is not None and folder.st_dev != ids[2]:  # (review 108: an unmounted
            return "unreachable"  # volume's mount point was taken for its folder, and
        return "gone"  # the ledger for deleted: a run released its stream again)
    except OSError:
        return "unreachable"
    return "live" if stat.S_ISREG(mode) else "unreachable"


def _moved_here(ids: tuple[int, int, int] | None, ledger: str) -> bool:
    """Whether ``ledger`` is the recorded ledger's file (its device and inode)."""
    if ids is None:
        return False
    try:
        st = os.stat(ledger)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) == ids[:2]


def _ids(ledger: str) -> str:
    """The ledger's device and inode and its folder's device, as an entry records them."""
    try:
        st, folder = os.stat(ledger), os.stat(os.path.dirname(ledger))
    except OSError:
        return ""
    return f"{st.st_dev} {st.st_ino} {folder.st_dev}"


def _refusal(
    recorded: str,
    ledger: str,
    key_file: str | None,
    entry: str,
    state: str,
    recorded_key: str | None,
    default: bool,
) -> str:
    if not default:
        why = "--ledger names another file"
    elif not recorded_key:  # recorded by a library's Spark stream (its ledger= named)
        why = "that ledger was named by a program's ledger=, and this run names none"
    elif key_file is not None and recorded_key == os.path.realpath(key_file):
        why = "that ledger was named with --ledger, and this run names none"
    else:
        why = "a copy of a key must use its key's one ledger"
    # the key file beside the recorded ledger, when it is that key file's default one
    beside = bool(recorded_key) and recorded == f"{recorded_key}.ledger"
    use = " or use the key file beside it" if beside else ""
    where = "" if key_file is None else f" in --key-file {key_file!r}"
    head = (
        f"the key{where} has its releases recorded in the ledger {recorded!r}, not in "
        f"{ledger!r}{' (the ledger beside this key file)' if default else ''}: {why}; a "
        "key's runs keep one ledger, or a run could release a used noise scope again, and "
        "pass the dataset's --budget-cap, unseen"
    )
    if state == "unreachable":
        return (
            f"{head}; {recorded!r} cannot be reached now (its folder is missing, or on "
            "another file system than it was, as on an unmounted volume, or it is not a "
            "file): mount it and run again, or pass "
            f"--ledger {recorded!r}; if it is gone for good, remove the registry entry "
            f"{entry!r}"
        )
    if _size(ledger) > 0:
        return (
            f"{head}; both hold releases of this key: append the lines of {ledger!r} to "
            f"{recorded!r} (`cat {ledger} >> {recorded}`), remove {ledger!r}, and pass "
            f"--ledger {recorded!r}{use}"
        )
    empty = (
        f" ({recorded!r} holds no releases yet: a run from that key file recorded it and "
        "released nothing, or is starting now; if none uses it, remove it)"
        if _size(recorded) == 0
        else ""
    )
    return (
        f"{head}{empty}; pass --ledger {recorded!r}{use}. If "
        f"{ledger!r} is to be the key's ledger, move that ledger there (`mv`: the record "
        "follows it); to keep two ledgers of one key on purpose, set "
        "DPSTREAM_KEY_REGISTRY=off"
    )


def _recorded_in(recorded: str, key_file: str | None) -> str:
    """The start of a refusal: where the key's releases are recorded."""
    where = "" if key_file is None else f" in --key-file {key_file!r}"
    return f"the key{where} has its releases recorded in the ledger {recorded!r}"


def _gone(recorded: str, key_file: str | None, entry: str) -> str:
    """The refusal of a run whose key's recorded ledger is gone, and no ledger given."""
    return (
        f"{_recorded_in(recorded, key_file)}, which is gone (no such file in its "
        "folder): a new, empty ledger would not know the streams it recorded, and a run "
        "of one of them over other data would release its steps again under the same "
        "noise. If the ledger was moved, pass --ledger with "
        "its new path (the record follows it). If it was deleted, its releases are lost "
        "to every check: use a new key for new streams; only to go on with this key "
        f"anyway, forgetting them on purpose, remove the registry entry {entry!r}"
    )


def _replaced(recorded: str, ledger: str, key_file: str | None, entry: str) -> str:
    """The refusal of a run whose key's ledger was rolled back (see :func:`_rolled_back`)."""
    where = "the file there now" if same_file(recorded, ledger) else f"{ledger!r}"
    return (
        f"{_recorded_in(recorded, key_file)}, and {where} is shorter than a run of the "
        "key left that ledger, or holds other lines before that point (a backup put "
        "back, or copied over it?): a ledger rolled back forgets the releases made "
        "since, and a run could release them again under the same noise, or pass its "
        "dataset's cap. Put the key's own ledger back; if this file is that ledger "
        "with all its lines (moved across file systems), remove the registry entry "
        f"{entry!r} to record it again"
    )


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return -1


@contextlib.contextmanager
def _entry_lock(entry: str, wait: bool = True) -> Iterator[bool]:
    """Hold ``ENTRY.lock`` (``flock``) while an entry is read, decided on and written;
    yields whether it is held (``wait`` False: not when another process holds it)."""
    try:
        import fcntl
    except ImportError:  # no flock: the decision is not serialised
        yield True
        return
    try:
        fd = os.open(f"{entry}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:  # a registry that cannot be written (a read-only home, a
        # folder another user owns): the entry is still read and its rules hold, but
        # nothing is recorded; a warning, not an error (review 108: every run stopped)
        _warn_once(os.path.dirname(entry), exc)
        try:
            fd = os.open(f"{entry}.lock", os.O_RDONLY)  # an existing lock serialises still
        except OSError:
            yield True
            return
    try:
        from .ledger_file import _flock

        if not wait:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
        else:  # polled, said after a moment, refused after DPSTREAM_LEDGER_WAIT (60 s)
            # as the ledger's own lock is (review 110: a run waited here without a word
            # or a limit)
            _flock(fd, fcntl.LOCK_EX, f"{entry}.lock", None, what="the key registry's lock")
        yield True
    finally:
        os.close(fd)


_warned: set[str] = set()


def _warn_once(folder: str, exc: OSError) -> None:
    if folder in _warned:
        return
    _warned.add(folder)
    _LOG.warning(
        "could not record the key's ledger in %s (%s): a copy of this key would not "
        "find its ledger; set %s to a writable directory",
        folder,
        exc,
        ENV,
    )


def _make_folder(folder: str) -> bool:
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
    except OSError as exc:
        _warn_once(folder, exc)
        return False
    return True


def _read(entry: str) -> tuple[str | None, str | None, tuple[int, int, int] | None, Mark]:
    """The recorded ledger, the key file it was recorded from (None: no entry), the
    ledger's identity (:func:`_ids`; None when the entry has none), and its mark (the
    size a run of the key left it at and a digest of the bytes before it; (0, None)
    when the entry has none)."""
    try:
        if not stat.S_ISREG(os.stat(entry).st_mode):  # (a device would be read forever)
            raise LedgerError(
                f"the key registry entry {entry!r} is not a regular file: remove it, or "
                f"set {ENV}=off"
            )
        with open(entry, encoding="utf-8") as fh:
            lines = fh.read(_ENTRY_MAX).splitlines()
    except FileNotFoundError:
        return None, None, None, (0, None)
    except UnicodeDecodeError:
        raise LedgerError(
            f"the key registry entry {entry!r} is not text (edited?): remove it, or set {ENV}=off"
        ) from None
    except OSError as exc:
        raise LedgerError(
            f"cannot read the key registry entry {entry!r}: {exc.strerror}; fix it, or "
            f"set {ENV}=off"
        ) from None
    lines += ["", "", "", ""]
    parts = lines[2].split()
    ids = (
        (int(parts[0]), int(parts[1]), int(parts[2]))
        if len(parts) == 3 and all(p.isdigit() for p in parts)
        else None
    )
    fields = lines[3].split()
    size = int(fields[0]) if fields and fields[0].isdigit() and len(fields[0]) < 20 else 0
    tail = fields[1] if size and len(fields) > 1 and len(fields[1]) == 32 else None
    return lines[0].strip() or None, lines[1].strip() or None, ids, (size, tail)


def _write(entry: str, ledger: str, key_file: str, mark: Mark = (0, None)) -> None:
    """Record ``ledger`` (and the key file it is used from, and its mark) at ``entry``
    atomically (a reader sees the old or the new entry)."""
    folder = os.path.dirname(entry)
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".entry-")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(f"{ledger}\n{key_file}\n{_ids(ledger)}\n{mark[0]} {mark[1] or ''}\n")
            os.replace(tmp, entry)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError as exc:
        _warn_once(folder, exc)
