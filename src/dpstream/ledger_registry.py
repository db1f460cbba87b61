"""Which ledger a key's releases are recorded in, kept per user so a copy of the key finds it.

Layer 6 of dpstream (the edges); stdlib and the key only.

Without ``--ledger`` a key's release ledger lives beside the file the key's path
resolves to (:func:`dpstream.ledger.default_ledger_path`). A copy of the key file (or
a hard link, or the same key saved again elsewhere) resolves to another file, so it
found a fresh, empty ledger: the replay refusal and the budget cap were both blind to
what the first ledger held, and a run from the copy could release a used noise scope
again from other data (the difference of two such releases is the exact difference of
the true counts).

So the first default ledger a key is used with is recorded in a small per-user
registry, under the key's public fingerprint (:meth:`dpstream.noise.NoiseKey.fingerprint`,
a keyed digest: the registry holds no secret): a file
``$DPSTREAM_KEY_REGISTRY/<fingerprint>`` (default ``$XDG_STATE_HOME/dpstream/keys``,
else ``~/.local/state/dpstream/keys``) holding the ledger's path. A run whose default
ledger is another file while the recorded one still exists is refused, naming both:
pass ``--ledger`` with the recorded path, or use the key file beside it. A recorded
ledger that no longer exists (removed, or moved with its key) is replaced by the new
one. ``--ledger PATH`` is the operator naming the ledger, and is neither checked nor
recorded.

The registry is per user and per machine: a key copied to another machine or used by
another user is not seen (docs/operations.md says to keep one ledger per key, or
to name it with ``--ledger`` on shared storage). ``DPSTREAM_KEY_REGISTRY=off`` turns
it off. A registry that cannot be written (a read-only home) is logged and the run
goes on: it is a guard against a mistake, and the ledger itself is unchanged.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from typing import TYPE_CHECKING

from .errors import LedgerError

if TYPE_CHECKING:
    from .noise import NoiseKey

__all__ = ["ENV", "check_default_ledger", "registry_dir"]

#: The environment variable that names the registry's directory (``off``: none).
ENV = "DPSTREAM_KEY_REGISTRY"

_LOG = logging.getLogger("dpstream")


def registry_dir() -> str | None:
    """The registry's directory, or ``None`` when turned off (``DPSTREAM_KEY_REGISTRY=off``)."""
    chosen = os.environ.get(ENV)
    if chosen == "off":
        return None
    if chosen:
        return os.path.expanduser(chosen)
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state"
    )
    return os.path.join(state, "dpstream", "keys")


def check_default_ledger(key: NoiseKey, ledger: str, key_file: str) -> None:
    """Refuse ``ledger`` (the default ledger of ``key_file``) when the registry names
    another ledger of the same key that still exists; else record ``ledger`` there.

    Raises:
        LedgerError: the key's releases are recorded in another ledger.
    """
    folder = registry_dir()
    if folder is None:
        return
    entry = os.path.join(folder, key.fingerprint())
    ledger = os.path.realpath(ledger)
    recorded = _read(entry)
    if recorded is not None and recorded != ledger and os.path.isfile(recorded):
        if not _same_file(recorded, ledger):
            raise LedgerError(
                f"the key in --key-file {key_file!r} has its releases recorded in the "
                f"ledger {recorded!r}, not in {ledger!r} (the ledger beside this key "
                "file): a copy of a key must use its key's one ledger, or a run could "
                f"release a used noise scope again; pass --ledger {recorded!r}, or use the "
                f"key file beside it. If this key file is the one to keep, move that "
                f"ledger to {ledger!r} (registry entry: {entry!r})"
            )
    if recorded != ledger:
        _write(entry, ledger)


def _read(entry: str) -> str | None:
    try:
        with open(entry, encoding="utf-8") as fh:
            text = fh.read().strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        _LOG.warning("could not read the key registry entry %s: %s", entry, exc)
        return None
    return text or None


def _write(entry: str, ledger: str) -> None:
    """Record ``ledger`` at ``entry`` atomically (a reader sees the old or new path)."""
    folder = os.path.dirname(entry)
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".entry-")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(ledger + "\n")
            os.replace(tmp, entry)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError as exc:
        _LOG.warning(
            "could not record the key's ledger in %s (%s): a copy of this key would "
            "not find its ledger; set %s to a writable directory",
            folder,
            exc,
            ENV,
        )


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False
