"""The trainers' progress bar: the seconds of a run against its time limit (a bar
with a percentage), or the seconds alone when the run has none (it stops by epochs)."""
from __future__ import annotations

import math


def seconds_bar(max_seconds, desc):
    """A tqdm bar counting a run's seconds (tqdm is imported here, on first use)."""
    from tqdm import tqdm
    if math.isfinite(max_seconds):
        total = round(max_seconds, 1)
        fmt = "{desc}: {percentage:3.0f}%|{bar}| {n:.1f}/{total:.1f} s {postfix}"
    else:
        total, fmt = None, "{desc}: {n:.1f} s {postfix}"
    return tqdm(total=total, desc=desc, unit="s", bar_format=fmt, leave=False)
