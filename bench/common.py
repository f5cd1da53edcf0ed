"""Benchmark protocol shared by every scenario: run header, repetitions, results files.

Method (after sortedcontainers' docs/performance and crossbeam-channel's benchmarks):
one warm-up run, then ``reps`` repetitions in which every competitor runs once per
repetition, interleaved, so that a noisy neighbour hurts all of them alike; we report
min / median / max of the rate and write everything to JSON. Plotting is a separate
step (``python -m bench plot``).
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

RESULTS_DEFAULT = Path(__file__).resolve().parent / "results"
RESULTS = RESULTS_DEFAULT


def set_results_dir(path) -> None:
    """Write results somewhere else (``--out``), e.g. a temporary folder in tests."""
    global RESULTS
    RESULTS = Path(path)


def header(args) -> dict:
    import numpy
    import numba
    import relaxed
    try:
        load = os.getloadavg()
    except OSError:  # pragma: no cover
        load = None
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:  # pragma: no cover
        pass
    return {
        "command": " ".join([os.path.basename(sys.executable), "-m", "bench"] + sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "python": sys.version.split()[0],
        "numpy": numpy.__version__,
        "numba": numba.__version__,
        "relaxed": relaxed.__version__,
        "platform": platform.platform(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "loadavg_at_start": load,
        "seed": args.seed,
        "reps": args.reps,
        "settings": {k: v for k, v in vars(args).items() if k not in ("func",)},
    }


def print_header(h: dict) -> None:
    print(f"# {h['command']}")
    print(f"# {h['date']}  python {h['python']}  numpy {h['numpy']}  numba {h['numba']}  "
          f"relaxed {h['relaxed']}")
    print(f"# {h['cpu']}  ({h['cpu_count']} CPUs)  load {h['loadavg_at_start']}  seed {h['seed']}  "
          f"reps {h['reps']}")


@dataclass
class Series:
    """Repeated measurements of one competitor at one setting (rates in ops/s)."""
    competitor: str
    setting: dict
    rates: list = field(default_factory=list)
    extra: dict = field(default_factory=dict)

    def summary(self) -> dict:
        r = sorted(self.rates)
        return {"competitor": self.competitor, **self.setting,
                "min": r[0] if r else None, "median": statistics.median(r) if r else None,
                "max": r[-1] if r else None, "rates": self.rates, **self.extra}


def results_dir() -> Path:
    return RESULTS


def write_json(name: str, hdr: dict, rows: list, extra: dict | None = None) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    with open(tmp, "w") as f:
        json.dump({"header": hdr, "results": rows, **(extra or {})}, f, indent=1)
    os.replace(tmp, path)
    return path


def load_results(name: str) -> dict | None:
    """results/<name>.json as written by :func:`write_json`, or None when that
    scenario has not been run."""
    p = results_dir() / f"{name}.json"
    return json.loads(p.read_text()) if p.exists() else None


def save_plot(fig, path, dpi=110):
    """Lay out and write a matplotlib figure; returns ``path``."""
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    return path


def fmt_rate(x: float | None) -> str:
    if x is None:
        return "-"
    if x >= 1e6:
        return f"{x / 1e6:.2f} M"
    if x >= 1e3:
        return f"{x / 1e3:.1f} K"
    return f"{x:.0f}"


def parse_counts(text: str, maximum: int | None = None) -> list[int]:
    """'1,2,4' or '1-16' -> sorted list of positive ints."""
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if "-" in part:
            a, b = part.split("-", 1)
            out.update(range(int(a), int(b) + 1))
        elif part:
            out.add(int(part))
    if not out or min(out) < 1:
        raise ValueError(f"counts must be positive integers like '1,2,4' or '1-8', got {text!r}")
    return sorted(out)
