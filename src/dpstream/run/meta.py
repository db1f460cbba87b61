"""The public metadata of a run: a sidecar file next to its releases, and each step's noise level.

Layer 6 of dpstream (the edges). ``dpstream run --output releases.jsonl``
writes ``releases.jsonl.meta.json`` when the run starts: the mechanism, the
horizon T, the tree base, the guarantee (rho, epsilon, delta, per event), the
noise at the worst step and the half-width of a 95% interval there, the
discovery threshold of the unknown-domain mechanism, and the dpstream version.
It holds exactly the numbers ``dpstream plan --json`` prints for the same
options (:func:`dpstream.planning.describe`), so a reader of the releases (the
live view, ``dpstream.view``) never recomputes them. Every number in it is a
function of the public parameters only: nothing depends on the data or the key.

Each JSON Lines release also carries its own noise level, ``"noise_std"`` in
its ``"meta"``: the standard deviation of a released count at that step,
``tau * sqrt(|I_t(r)| * L_r)`` (``thm:BinMechUtility``), a function of t and
the parameters only, so publishing it costs no privacy. A mechanism that does
not give its per-step noise (top-k, meta) writes the worst-step value, an
upper bound, and the sidecar says which (``"noise_std_per_step"``).

Reading and writing the sidecar happen in one function each
(:func:`write_run_meta`, :func:`read_run_meta`), so a new output layout keeps
one place to change.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._crashpoints import write as crash_write
from .lock import check_target

if TYPE_CHECKING:
    from ..mechanisms.protocol import ContinualMechanism

__all__ = [
    "SIDECAR_SUFFIX",
    "FORMAT",
    "sidecar_path",
    "describe_run",
    "noise_std_at",
    "write_run_meta",
    "read_run_meta",
    "NoiseStdFormatter",
]

#: ``OUTPUT`` + this suffix is the sidecar of output file ``OUTPUT``.
SIDECAR_SUFFIX = ".meta.json"
#: The ``"format"`` field that marks a dpstream sidecar (and its layout version).
FORMAT = "dpstream-run-meta/1"


def sidecar_path(output: str | os.PathLike[str]) -> Path:
    """The sidecar of output file ``output``: ``OUTPUT.meta.json`` in the same directory."""
    path = Path(output)
    return path.with_name(path.name + SIDECAR_SUFFIX)


def noise_std_at(mech: ContinualMechanism, t: int) -> float:
    """The standard deviation of a count ``mech`` releases at step ``t`` (data-independent).

    ``mech.noise_std_at(t)`` where the mechanism gives it (an optional capability
    of :class:`~dpstream.mechanisms.protocol.ContinualMechanism`); otherwise the
    worst step's (``mech.noise_std_worst``), an upper bound.
    """
    per_step = getattr(mech, "noise_std_at", None)
    if callable(per_step):
        return float(per_step(t))
    return float(mech.noise_std_worst)


def describe_run(
    mech: ContinualMechanism, *, name: str, base_given: bool, rounded: bool
) -> dict[str, Any]:
    """The sidecar's content for a run of ``mech`` (``--mechanism name``).

    The fields of :func:`dpstream.planning.describe` (mechanism, algorithm,
    horizon, base, tau, ``noise_std_worst``, ``ci95_half_width``, privacy,
    threshold...), plus the privacy unit, the counter, whether the counts are
    rounded, whether ``noise_std`` is per step, the 95% z-value and the
    dpstream version.
    """
    from .._version import __version__
    from ..planning import Z95, describe

    info = describe(mech, name=name, base_given=base_given)
    info.update(
        format=FORMAT,
        dpstream_version=__version__,
        unit=str(mech.privacy.unit),
        counter=str(mech.counter or "tree"),
        noise_version=int(mech.noise_version),
        rounded=bool(rounded),
        noise_std_per_step=callable(getattr(mech, "noise_std_at", None)),
        z95=Z95,
    )
    return info


def write_run_meta(output: str | os.PathLike[str], info: dict[str, Any]) -> Path:
    """Write ``info`` as the sidecar of ``output``, atomically; returns its path.

    The JSON goes to a temporary file in the same directory (with the output
    file's permissions if it exists, else the umask's), then replaces the
    sidecar in one rename, so a reader sees the old file or the new one,
    never half of one. A file already at the sidecar's path that is not a
    dpstream sidecar is refused (ValueError), never overwritten.
    """
    check_target(str(output))  # its name still leads where the run's lock is
    path = sidecar_path(output)
    if path.exists() or path.is_symlink():
        try:
            old = json.loads(_sidecar_text(path) or "")
        except (OSError, ValueError, RecursionError):  # nested too deeply: not a sidecar
            old = None
        if not (isinstance(old, dict) and old.get("format") == FORMAT):
            raise ValueError(
                f"{path} exists and is not a dpstream metadata file: refusing to "
                "overwrite it (move it, or write the releases elsewhere)"
            )
    text = json.dumps(info, indent=2, sort_keys=True, allow_nan=False, ensure_ascii=False)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            crash_write(fh, text + "\n")
        with contextlib.suppress(OSError):  # readable by whoever may read the releases
            os.chmod(tmp, stat.S_IMODE(os.stat(output).st_mode))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def _no_constant(name: str) -> None:
    """Refuse ``NaN`` and ``Infinity``: not JSON, and never in a sidecar (written without)."""
    raise ValueError(f"{name} is not a JSON number")


#: The most a sidecar may hold (one is about 2 KB): a larger file is not one.
SIDECAR_MAX_BYTES = 1 << 20


def _sidecar_text(path: str | os.PathLike[str]) -> str | None:
    """The text of the sidecar at ``path`` (None: no file), read only from a regular file
    of at most :data:`SIDECAR_MAX_BYTES` (review 103: a sidecar linked to /dev/zero was
    read until memory ran out, and a FIFO blocked the run for ever). Raises ValueError
    for anything else, and UnicodeDecodeError for bytes that are not UTF-8."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"metadata file {path}: not a regular file (a device or a pipe)")
        data = fh.read(SIDECAR_MAX_BYTES + 1)
    if len(data) > SIDECAR_MAX_BYTES:
        raise ValueError(
            f"metadata file {path}: larger than a metadata file ({len(data):,}+ bytes)"
        )
    return data.decode("utf-8")


def read_run_meta(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The sidecar at ``path`` (a ``*.meta.json`` file), or ``None`` if there is none.

    Raises:
        ValueError: the file is not a dpstream sidecar (not JSON, or JSON with
            ``NaN`` or ``Infinity``, nested too deeply to read, not an object, or no
            ``"format"`` of this layout), naming the file.
    """
    try:
        text = _sidecar_text(path)
    except UnicodeDecodeError:
        raise ValueError(f"metadata file {path}: not UTF-8 text") from None
    if text is None:
        return None
    try:
        info = json.loads(text, parse_constant=_no_constant)
    except ValueError as exc:
        raise ValueError(f"metadata file {path}: not valid JSON ({exc})") from None
    except RecursionError:  # a sidecar is a few levels deep; this is something else
        raise ValueError(
            f"metadata file {path}: not a dpstream metadata file (its JSON is nested "
            "too deeply to read)"
        ) from None
    if not isinstance(info, dict) or info.get("format") != FORMAT:
        raise ValueError(
            f'metadata file {path}: not a dpstream metadata file (expected "format": "{FORMAT}")'
        )
    return info


class NoiseStdFormatter:
    """Wraps a release formatter: each release's meta gains its step's ``noise_std``.

    The value is :func:`noise_std_at` of the mechanism at the release's t,
    data-independent, so it is public. Formats without a meta field (CSV)
    drop it, as they drop the rest of the meta.
    """

    def __init__(self, formatter: Any, mech: ContinualMechanism) -> None:
        self.formatter = formatter
        self.mech = mech
        self.name = formatter.name

    def header(self) -> bytes:
        return self.formatter.header()

    def format(self, release: Any) -> bytes:
        from ..mechanisms.base import Release

        std = noise_std_at(self.mech, int(release.t))
        if not math.isfinite(std):
            return self.formatter.format(release)
        meta = {**dict(release.meta), "noise_std": std}
        return self.formatter.format(
            Release(t=release.t, items=release.items, values=release.values, meta=meta)
        )
