"""``dpstream view`` and ``dpstream run --view``: the command-line side of the live view."""

from __future__ import annotations

import argparse
import os
import stat
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

# the parser's defaults only: the model, page and server are imported when a view starts
from .model import DEFAULT_MAX_STREAMS, DEFAULT_POLL, DEFAULT_TOP, MAX_SELECTED

if TYPE_CHECKING:
    from .server import ViewServer

__all__ = ["add_view_parser", "cmd_view", "start_run_view", "export_html"]

PROG = "dpstream"


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port in 0..65535, got {value}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 < value <= 60:
        raise argparse.ArgumentTypeError(f"expected seconds in (0, 60], got {text!r}")
    return value


def add_view_parser(sub: Any, parents: list[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Add the ``view`` subcommand to ``sub`` (an argparse subparsers object)."""
    view = sub.add_parser(
        "view",
        parents=parents,
        help="watch a releases file in a web page as it grows",
        description="Serve a local web page of a releases file written by `dpstream run` (JSON "
        "Lines): the top items with 95% intervals, the history of chosen items, "
        "the mechanism, progress and guarantee from its metadata file "
        "(FILE.meta.json). The page updates as releases are appended. It reads only "
        "the published files, never the state, the key or the events. With "
        "--export, write the same page as one static HTML file instead.",
    )
    view.add_argument(
        "releases",
        metavar="RELEASES.jsonl",
        help="the releases file (dpstream run --output) (required)",
    )
    view.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on; 0.0.0.0 (or :: for IPv6) shows the page to your "
        "network, ::1 is this machine over IPv6 (default: 127.0.0.1, this machine only)",
    )
    view.add_argument(
        "--port",
        type=_port,
        default=0,
        help="port to listen on; 0 picks a free one, printed on start (default: 0)",
    )
    view.add_argument(
        "--top",
        type=_positive_int,
        default=DEFAULT_TOP,
        metavar="N",
        help=f"how many of the largest items to show (default: {DEFAULT_TOP})",
    )
    view.add_argument(
        "--select",
        action="append",
        default=None,
        metavar="ITEM",
        help=f"an item whose history to show (repeat, up to {MAX_SELECTED}) "
        "(default: the current top 3)",
    )
    view.add_argument(
        "--meta",
        default=None,
        metavar="FILE",
        help="the metadata file (default: RELEASES.jsonl.meta.json beside it)",
    )
    view.add_argument(
        "--poll",
        type=_seconds,
        default=DEFAULT_POLL,
        metavar="SECONDS",
        help=f"how often to look for new releases (default: {DEFAULT_POLL})",
    )
    view.add_argument(
        "--max-streams",
        type=_positive_int,
        default=DEFAULT_MAX_STREAMS,
        metavar="N",
        help="how many pages may follow the file at once (one update stream "
        "each); more are answered 503 and retry (default: "
        f"{DEFAULT_MAX_STREAMS})",
    )
    view.add_argument(
        "--allow-host",
        action="append",
        default=None,
        metavar="NAME",
        help="a name the page may be reached by besides localhost and the "
        "address it listens on, e.g. this machine's name with --host "
        "0.0.0.0 (repeat; requests naming any other host get 403; "
        "default: none)",
    )
    view.add_argument(
        "--export",
        default=None,
        metavar="REPORT.html",
        help="write the page of the file as it is now to REPORT.html (one "
        "self-contained file, no script) and exit; REPORT.html must be new or an "
        "earlier export, which is replaced (default: serve)",
    )
    return view


def export_html(
    releases: str,
    out: str,
    *,
    top: int = DEFAULT_TOP,
    select: list[str] | None = None,
    meta: str | None = None,
) -> Path:
    """Write the static page of ``releases`` as it is now to ``out``; returns its path.

    ``out`` is a new file or an earlier export, replaced atomically; anything
    else there, the releases file and its metadata file are refused
    (:func:`dpstream.view.export.write_export`).
    """
    from ..run.meta import sidecar_path
    from .export import write_export
    from .model import ViewModel
    from .render import render_page

    model = ViewModel(releases, top=top, meta_path=meta)
    model.refresh()
    snap = model.snapshot(select)
    if snap.status == "missing":
        raise FileNotFoundError(2, "no such releases file", releases)
    if snap.status == "error":
        raise ValueError(snap.message or f"cannot read {releases}")
    if snap.status == "waiting" and snap.malformed:  # a report of nothing, from the wrong file
        raise ValueError(
            f"{releases!r} holds no release: its {snap.malformed} line(s) are not releases "
            "(is it the run's input? the view reads a run's --output in JSON Lines)"
        )
    protected: dict[str, str | os.PathLike[str]] = {
        "the releases file": releases,
        "its metadata file": sidecar_path(releases),
    }
    if meta is not None:
        protected["the --meta file"] = meta
    return write_export(out, render_page(snap, nonce=None), protected=protected)


def _check_releases_file(path: str) -> None:
    """Refuse a releases file that is a pipe or a device: the view reads it from its
    start at every change, so a FIFO would wait for a writer and ``/dev/zero`` would be
    read forever, before anything is served. (A file that does not exist yet is served:
    the page waits for it.)"""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    if not stat.S_ISREG(mode):
        raise ValueError(
            f"{path!r} is not a regular file (a pipe or a device): the view follows a "
            "releases file that a run writes (--output FILE)"
        )


def cmd_view(args: argparse.Namespace) -> int:
    """``dpstream view``: serve until Ctrl-C, or ``--export`` and exit."""
    if args.select is not None and len(args.select) > MAX_SELECTED:
        raise ValueError(f"--select: at most {MAX_SELECTED} items, got {len(args.select)}")
    _check_releases_file(args.releases)
    if args.export:
        path = export_html(
            args.releases, args.export, top=args.top, select=args.select, meta=args.meta
        )
        print(f"{PROG}: wrote {path}", file=sys.stderr)
        return 0
    from .model import ViewModel
    from .server import ViewServer

    model = ViewModel(args.releases, top=args.top, meta_path=args.meta)
    server = ViewServer(
        model,
        host=args.host,
        port=args.port,
        poll=args.poll,
        selected=args.select,
        max_streams=args.max_streams,
        allow_hosts=args.allow_host or (),
    ).start()
    try:
        print(f"{PROG} view: serving {args.releases} at {server.url} (Ctrl-C to stop)", flush=True)
        if args.host.strip("[]") not in ("127.0.0.1", "localhost", "::1"):
            print(
                f"{PROG} view: listening on {args.host}: the page is visible to other "
                "machines (it shows only the published releases)",
                file=sys.stderr,
            )
        server.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


def start_run_view(output: str) -> ViewServer:
    """``dpstream run --view``: serve the view of ``output`` while the run writes it.

    Prints the address on stderr (even with --quiet: it is what was asked for).
    """
    from .model import ViewModel
    from .server import ViewServer

    server = ViewServer(ViewModel(output)).start()
    print(f"{PROG}: live view of {output} at {server.url}", file=sys.stderr, flush=True)
    return server


def after_run(server: ViewServer) -> None:
    """Keep serving the finished run's view until Ctrl-C."""
    try:  # from here on, Ctrl-C is the way out, not an interruption
        server.refresh()  # the page shows the last release before the message says so
        print(
            f"{PROG}: the run is finished; the view stays at {server.url} until Ctrl-C",
            file=sys.stderr,
            flush=True,
        )
        server.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
