"""Log lines of the ``dpstream`` command: plain text or JSON, on stderr.

Layer 6 of dpstream (an edge). The package logs through the standard
``logging`` module under the ``"dpstream"`` logger; the library itself adds
no handler (an application decides where its logs go). The command line
installs one handler on stderr with :func:`setup_logging`: text lines
``dpstream: message`` by default, or one JSON object per line with
``--log-format json`` (fields ``time``, ``level``, ``logger``, ``message`` and
any structured extras a line carries, e.g. ``step``, ``events``, ``eta_s``).

Log lines carry counts, rates and paths: never an item or a record's
content (see the privacy notes in ``docs/privacy.md``).
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import sys
from typing import Any

__all__ = ["LOGGER", "setup_logging", "JsonFormatter", "log_fields"]

LOGGER = "dpstream"

#: The attribute of a log record holding its structured fields.
_FIELDS = "dpstream_fields"


def log_fields(**fields: Any) -> dict[str, Any]:
    """``extra=`` for a log call: structured fields that JSON lines carry as keys."""
    return {_FIELDS: fields}


class JsonFormatter(logging.Formatter):
    """One JSON object per log record."""

    def format(self, record: logging.LogRecord) -> str:
        obj: dict[str, Any] = {
            "time": _dt.datetime.fromtimestamp(record.created, _dt.timezone.utc).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        obj.update(getattr(record, _FIELDS, {}))
        return json.dumps(obj, ensure_ascii=False, default=str)


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time of the record (tests swap it)."""

    def __init__(self) -> None:
        super().__init__()

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:  # StreamHandler.__init__ sets it
        pass


def setup_logging(fmt: str = "text", *, quiet: bool = False) -> logging.Logger:
    """Send the ``dpstream`` logger's records to stderr, as text or JSON.

    ``quiet`` keeps warnings and errors only. Calling it again replaces the
    handler it installed before (one process may run several commands).
    """
    if fmt not in ("text", "json"):
        raise ValueError(f"--log-format must be text or json, got {fmt!r}")
    logger = logging.getLogger(LOGGER)
    for handler in list(logger.handlers):
        if isinstance(handler, _StderrHandler):
            logger.removeHandler(handler)
    handler = _StderrHandler()
    handler.setFormatter(
        JsonFormatter() if fmt == "json" else logging.Formatter(f"{LOGGER}: %(message)s")
    )
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING if quiet else logging.INFO)
    logger.propagate = False
    return logger
