"""Exceptions raised by dpstream.

Layer 1 of dpstream (imports nothing from it): every layer raises these.

One base class, :class:`DPStreamError`, so that callers can catch everything the
library raises on purpose, and a few subclasses for the failures a stream can
meet at run time. Bad arguments raise the built-in ``TypeError`` or
``ValueError`` with the parameter's name in the message.
"""

from __future__ import annotations


class DPStreamError(Exception):
    """Base class of the errors dpstream raises on purpose."""


class InvalidEventError(DPStreamError, ValueError):
    """An event that breaks the mechanism's contract.

    Examples: more items than ``max_items`` (the l0 bound Delta0 that the
    privacy guarantee assumes), an item outside a known domain, an item that is
    not hashable. The mechanism's state is unchanged when this is raised.
    """


class InvalidItemError(InvalidEventError, TypeError):
    """An event holds something that is not an item (items are str, int or bytes).

    Both an :class:`InvalidEventError` (a bad record, which the command line's
    ``--on-invalid`` policy handles) and a ``TypeError`` (the wrong type).
    """


class HorizonExceededError(DPStreamError):
    """A release was asked for at a time step past the declared horizon T."""


class BudgetExhaustedError(DPStreamError):
    """A composition would spend more privacy budget than was declared."""


class StateError(DPStreamError):
    """A checkpoint cannot be used: wrong key, other parameters, or corrupt."""


class LedgerError(StateError):
    """The release ledger refuses a step, or cannot be read or written."""


class BudgetCapError(LedgerError):
    """The run would take its dataset past ``--budget-cap``; nothing was released."""
