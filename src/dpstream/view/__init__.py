"""A live web view of a running release: ``dpstream view RELEASES.jsonl``.

Layer 6 of dpstream (an edge). It reads only what a run publishes: the JSON
Lines releases file as it grows, and its metadata sidecar
(``RELEASES.jsonl.meta.json``, :mod:`dpstream.run.meta`). It never opens the
state, the key or the raw events, and imports nothing of the mechanisms.

* :mod:`.follow` reads the complete lines appended to a file;
* :mod:`.model` keeps what a page shows, in bounded memory (the last
  release's top items, a few items' histories; :mod:`.extract` reads an
  item's counts out of a line without parsing the rest);
* :mod:`.render` turns it into HTML and server-side SVG, escaping every name;
* :mod:`.server` serves it (standard-library HTTP and server-sent events);
* :mod:`.command` is the command line (``view``, ``run --view``, ``--export``);
* :mod:`.export` writes ``--export``'s file (a new one or an earlier export, never another).

The names below are loaded when first used (PEP 562), so that building the
``dpstream`` parser (which adds ``view``) does not import the server.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .model import ViewModel, parse_release, top_items
    from .render import render_page
    from .server import ViewServer

_WHERE = {
    "ViewModel": ".model",
    "parse_release": ".model",
    "top_items": ".model",
    "render_page": ".render",
    "ViewServer": ".server",
}

__all__ = ["ViewModel", "ViewServer", "parse_release", "render_page", "top_items"]


def __getattr__(name: str) -> Any:
    """Load a public name on first use."""
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
