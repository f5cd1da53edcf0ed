"""The Hogwild estimators' ``verbose=`` through the ``logging`` module.

Each estimator module logs its per-epoch lines on its own logger
(``logging.getLogger(__name__)``): at INFO when the estimator's ``verbose`` is set,
at DEBUG otherwise, so an application that configures logging sees them where it
routes them. Nothing is configured at import. ``verbose`` asks for the lines to be
shown: for the time of a fit (:func:`verbose_logging`) the module's logger is let
through at INFO and, when no handler would show them (logging not configured), a
handler that writes the bare message to stdout (where ``verbose`` printed before)
is attached, then removed.
"""
from __future__ import annotations

import contextlib
import logging
import sys


def epoch_level(verbose) -> int:
    """The level of an estimator's per-epoch lines: INFO with ``verbose``, else DEBUG."""
    return logging.INFO if verbose else logging.DEBUG


def _shown(logger, level) -> bool:
    """Whether a record of ``level`` from ``logger`` reaches a handler that would emit it
    (a NullHandler does not count)."""
    c = logger
    while c is not None:
        if any(not isinstance(h, logging.NullHandler) and level >= h.level
               for h in c.handlers):
            return True
        if not c.propagate:
            return False
        c = c.parent
    return False


@contextlib.contextmanager
def verbose_logging(logger, verbose):
    """With ``verbose``, let ``logger``'s INFO records through for the block, to the
    application's handlers or, where logging is not configured, to stdout."""
    if not verbose:
        yield
        return
    old_level = logger.level
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    handler = None
    if not _shown(logger, logging.INFO):
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    try:
        yield
    finally:
        if handler is not None:
            logger.removeHandler(handler)
        logger.setLevel(old_level)
