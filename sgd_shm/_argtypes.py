"""Argument types and checks shared by the command lines (``python -m sgd_shm ...``,
``python -m bench ...``): a bad value is argparse's one-line error naming the option
(exit status 2), before any work starts."""
from __future__ import annotations

import argparse
import math
import os

__all__ = ["finite_float", "seed_int", "out_dir"]


def finite_float(text: str) -> float:
    """A finite number (inf and nan are refused: a run of --seconds inf never ends)."""
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(x):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return x


def seed_int(text: str) -> int:
    """A seed: an int >= 0 (numpy's generators take no negative seed)."""
    try:
        x = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int >= 0, got {text!r}") from None
    if x < 0:
        raise argparse.ArgumentTypeError(f"must be an int >= 0, got {x}")
    return x


def out_dir(ap: argparse.ArgumentParser, path, option: str = "--out") -> None:
    """Create the output folder now, so that a path that cannot hold the results fails
    before the work and not after it."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        ap.error(f"{option} {os.fspath(path)!r}: cannot create the folder ({e.strerror}); "
                 "name a folder you can write")
    if not os.access(path, os.W_OK | os.X_OK):
        ap.error(f"{option} {os.fspath(path)!r}: the folder is not writable; name a folder "
                 "you can write")
