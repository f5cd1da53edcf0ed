"""Benchmark protocol shared by every scenario: run header, repetitions, results files.

Method (after sortedcontainers' docs/performance and crossbeam-channel's benchmarks):
one warm-up run, then ``reps`` repetitions in which every competitor runs once per
repetition, interleaved, so that a noisy neighbour hurts all of them alike; we report
min / median / max of the rate and write everything to JSON. Plotting is a separate
step (``python -m bench plot``).
"""
from __future__ import annotations

import functools
import glob
import json
import os
import platform
import re
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

RESULTS_DEFAULT = Path(__file__).resolve().parent / "results"
RESULTS = RESULTS_DEFAULT


LABEL = None           # --label: runs are written as <scenario>@<label>.json
LABEL_CHARS = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,39}")


def set_results_dir(path) -> None:
    """Write results somewhere else (``--out``), e.g. a temporary folder in tests."""
    global RESULTS
    RESULTS = Path(path)


def set_label(label) -> None:
    """Write each scenario's results as ``<scenario>@<label>.json`` (``--label``):
    a run kept beside the main one, e.g. from another machine; the benchmarks page
    shows it under the scenario, the plots keep to the main run. None: the main
    ``<scenario>.json``."""
    global LABEL
    if label is not None and not LABEL_CHARS.fullmatch(label):
        raise ValueError(f"label must be 1-40 letters, digits, '.', '_' or '-' starting "
                         f"with a letter or digit (it names a file), got {label!r}")
    LABEL = label


def labelled_results(name: str) -> list[tuple[str, dict]]:
    """(label, results) of every ``<name>@<label>.json`` in the results folder,
    sorted by label."""
    found = sorted(results_dir().glob(f"{glob.escape(name)}@*.json"))
    return [(p.stem.split("@", 1)[1], json.loads(p.read_text())) for p in found]


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
        # see handoff_ns: which cores the run's threads shared, as far as one can tell
        "handoff_ns_at_start": handoff_ns() if (os.cpu_count() or 1) > 1 else None,
        "seed": args.seed,
        "reps": getattr(args, "reps", None),     # None: a scenario with no repetitions
        "settings": {k: v for k, v in vars(args).items() if k not in ("func",)},
    }


def timed_threads(work, n):
    """Seconds from starting ``n`` threads running work(0) .. work(n - 1) to the end
    of the last one."""
    import threading
    ths = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    t0 = time.perf_counter()
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    return time.perf_counter() - t0


#: a handoff slower than this: the two threads' cores share no cache level (e.g. two
#: vCPUs on different core complexes of an AMD EPYC), see handoff_ns
FAR_HANDOFF_NS = 100.0


@functools.lru_cache(maxsize=None)
def _ping_pong_player():
    """The compiled player of handoff_ns (built once per process: numba and the
    kernel are loaded only by the benchmarks that measure the handoff)."""
    import numba as nb

    from sgd_shm.core.atomics import load_relaxed, store_release

    @nb.njit(nogil=True)
    def player(flag, me, other, k):
        spins = 0                # a handoff takes tens of spins when both threads run
        for _ in range(k):
            while True:
                f = load_relaxed(flag, 0)
                if f == me:
                    break
                spins += 1
                if f < 0 or spins > 1000 * k + 10_000_000:  # the other gave up, or the
                    store_release(flag, -1)                 # two rarely ran at once
                    return
            store_release(flag, other)
    return player


def handoff_ns(n=50_000, reps=3):
    """Nanoseconds to pass one cache line from a thread to another and back, halved
    (a ping-pong on a flag; median of ``reps``). Whatever shares weights between
    workers pays it on every contended line: about 40-60 ns between cores under one
    shared L3, three or four times that between core complexes or sockets. A VM's
    two vCPUs may move between such placements while it runs, which changes
    the 2-worker speed-ups measured beside it (see FAR_HANDOFF_NS). None when the
    two threads did not run at once (millions of spins of waiting: a busy machine),
    which bounds the time it takes there."""
    import numpy as np

    player = _ping_pong_player()
    flag = np.zeros(16, np.int64)
    player(flag, 0, 0, 1)

    def once():
        flag[0] = 0
        seconds = timed_threads(lambda a: player(flag, a, 1 - a, n), 2)
        return None if flag[0] < 0 else seconds / (2 * n) * 1e9
    times = [once() for _ in range(reps)]
    return None if None in times else float(np.median(times))


def placement(before, after):
    """"near" when both handoffs (handoff_ns) around a run were under FAR_HANDOFF_NS
    (the threads' cores shared a cache), "far" when both were over, else "mixed"."""
    if before is None or after is None:
        return "mixed"
    far = [h >= FAR_HANDOFF_NS for h in (before, after)]
    return "far" if all(far) else ("near" if not any(far) else "mixed")


def print_header(h: dict) -> None:
    print(f"# {h['command']}")
    print(f"# {h['date']}  python {h['python']}  numpy {h['numpy']}  numba {h['numba']}  "
          f"relaxed {h['relaxed']}")
    print(f"# {h['cpu']}  ({h['cpu_count']} CPUs)  load {h['loadavg_at_start']}  seed {h['seed']}"
          + (f"  reps {h['reps']}" if h.get("reps") is not None else ""))
    if h.get("handoff_ns_at_start") is not None:
        print(f"# cache-line handoff between two threads {h['handoff_ns_at_start']:.0f} ns "
              f"(over {FAR_HANDOFF_NS:.0f}: cores sharing no cache)")


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
    path = RESULTS / (f"{name}@{LABEL}.json" if LABEL else f"{name}.json")
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
