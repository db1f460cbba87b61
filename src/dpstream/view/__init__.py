"""A live web view of a running release: ``dpstream view RELEASES.jsonl``.

Layer 6 of dpstream (an edge). It reads only what a run publishes: the JSON
Lines releases file as it grows, and its metadata sidecar
(``RELEASES.jsonl.meta.json``, :mod:`dpstream.run.meta`). It never opens the
state, the key or the raw events, and imports nothing of the mechanisms.

* :mod:`.follow` reads the complete lines appended to a file;
* :mod:`.model` keeps what a page shows, in bounded memory (the last
  release's top items, a few items' histories);
* :mod:`.render` turns it into HTML and server-side SVG, escaping every name;
* :mod:`.server` serves it (standard-library HTTP and server-sent events);
* :mod:`.command` is the command line (``view``, ``run --view``, ``--export``).
"""

from .model import ViewModel, parse_release, top_items
from .render import render_page
from .server import ViewServer

__all__ = ["ViewModel", "ViewServer", "parse_release", "render_page", "top_items"]
