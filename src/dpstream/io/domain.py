"""Known-domain files (``--domain``): the items a known-domain mechanism releases.

Layer 6 of dpstream (an edge). A domain file is a JSON array of items (strings
or integers, read as text) or one item per line; an item listed twice, or a
file holding none, is an error.
"""

from __future__ import annotations

import json
import os
import stat

from .records import guard_lines, open_input, parse_items, shorten, valid_text

__all__ = ["domain_list", "read_domain"]


def read_domain(path: str) -> list[str]:
    """The known domain: a JSON array of items, or one item per line (blank lines skipped)."""
    if path != "-" and os.path.exists(path) and stat.S_ISCHR(os.stat(path).st_mode):
        raise ValueError(  # /dev/zero or /dev/urandom: read whole, it never ends
            f"domain file {path!r} is a device, not a file of items"
        )
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
        return domain_list(values, f"domain file {path!r}")
    domain = [line.strip() for line in text.splitlines() if line.strip()]
    _refuse_other_files(domain, path)
    return _checked(domain, f"domain file {path!r}")


def _refuse_other_files(domain: list[str], path: str) -> None:
    """Refuse a file of lines that is plainly not a domain, before a release names its
    lines as items (every release of a known domain names each item): a noise key
    file (its one line of 64 hex characters: a release would publish the key, and the
    noise of every stream under it), or a file of JSON objects (the input's events,
    with their user ids). A domain of one such item is given as a JSON array."""
    from ..noise import is_key_text

    if len(domain) <= 2 and is_key_text(" ".join(domain)):
        raise ValueError(  # (spaced, or on two lines as `xxd -p` writes it: review 104)
            f"domain file {path!r} holds 64 hexadecimal characters: a noise key file "
            "(dpstream keygen writes them), not a domain; a release would publish it. Give "
            'the file of the items to release (a domain of such items: a JSON array, ["..."])'
        )
    for n, line in enumerate(domain[:100], start=1):
        if line.startswith("{") and line.endswith("}"):
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record:
                raise ValueError(
                    f"domain file {path!r}: its line {n} is a JSON object (an event "
                    "record: is it the input?), not an item; a release would publish its "
                    "lines. Give the file of the items to release, one a line (items of "
                    'that form: a JSON array, ["..."])'
                )


def domain_list(values: object, where: str) -> list[str]:
    """A domain given as a list (a JSON array, a config file's or a caller's list):
    strings, or integers as their decimal text, each once; anything else refused, as
    the items of an event are (``True`` or ``1.5`` is not the item "True" or "1.5")."""
    if isinstance(values, list):  # a caller's NumPy values (np.unique's) as Python's
        values = [_plain(v) for v in values]
    items, err = parse_items(values)
    if err:
        raise ValueError(f"{where}: {err}")
    return _checked(list(items or ()), where)


def _plain(value: object) -> object:
    """A NumPy integer as the Python int it holds, a string (``np.str_``) as a plain
    ``str`` (NumPy is not imported to ask); any other value as it is (a NumPy bool or
    float stays refused, as in a domain file)."""
    if isinstance(value, str):
        return str(value)
    if type(value).__module__ == "numpy" and getattr(value, "dtype", None) is not None:
        if value.dtype.kind in "iu":  # type: ignore[attr-defined]
            return int(value)  # type: ignore[call-overload]
    return value


def _checked(domain: list[str], where: str) -> list[str]:
    if not domain:
        raise ValueError(f"{where} holds no item")
    if len(set(domain)) != len(domain):
        seen: set[str] = set()
        for dup in domain:  # the first item seen a second time
            if dup in seen:
                raise ValueError(f"{where} lists {dup!r} twice")
            seen.add(dup)
    return domain
