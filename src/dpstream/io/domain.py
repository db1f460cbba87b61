"""Known-domain files (``--domain``): the items a known-domain mechanism releases.

Layer 6 of dpstream (an edge). A domain file is a JSON array of items (strings
or integers, read as text) or one item per line; an item listed twice, or a
file holding none, is an error.
"""

from __future__ import annotations

import json

from .records import guard_lines, open_input, parse_items, shorten, valid_text

__all__ = ["read_domain"]


def read_domain(path: str) -> list[str]:
    """The known domain: a JSON array of items, or one item per line (blank lines skipped)."""
    with open_input(path) as fh:
        text = "".join(guard_lines(fh, path))
    if not valid_text(text):
        raise ValueError(f"domain file {path!r} is not valid UTF-8 text")
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            values = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise ValueError(f"domain file {path!r}: not a valid JSON array ({exc.msg})") from None
        except (RecursionError, ValueError) as exc:
            raise ValueError(
                f"domain file {path!r}: not a valid JSON array "
                f"({shorten(str(exc) or 'nested too deeply', 80)})"
            ) from None
        items, err = parse_items(values)
        if err:
            raise ValueError(f"domain file {path!r}: {err}")
        domain = list(items or ())
    else:
        domain = [line.strip() for line in text.splitlines() if line.strip()]
    if not domain:
        raise ValueError(f"domain file {path!r} holds no item")
    if len(set(domain)) != len(domain):
        seen: set[str] = set()
        for dup in domain:  # the first item seen a second time
            if dup in seen:
                raise ValueError(f"domain file {path!r} lists {dup!r} twice")
            seen.add(dup)
    return domain
