"""The kit's MultiQueue in the C++ MultiQueue's own benchmark harness
(``python -m bench mq-harness --harness EXP --mq-lib MQ``).

The C++ MultiQueue of Williams, Sanders and Dementiev (ESA 2021) comes with its own
benchmarks (multiqueue_experiments). Its ``monotonic`` benchmark is the hold model: P
threads, pinned by the harness, prefill keys uniform in [1, 2^20], then each thread takes
batches of iterations from a shared counter and does "pop, push popped key + update"
with updates uniform in [0, 2^20] drawn before the clock starts. Built with its
``mq_random`` queue (wrapper/multiqueue.hpp, MQ_MODE_RANDOM: two-choice pops, random
pushes, 8-ary heaps with 16-element insertion and deletion buffers, ``-c`` queues per
thread) it is ``monotonic_mq_random``. This scenario builds that binary and, from the same
harness source with only its queue swapped (``bench/cxx/kit_mq.hpp``: the kit's compiled
core, called directly from the harness's threads), ``monotonic_kit``, then runs both at
each thread count in ``rounds`` interleaved rounds and reports M operations/s (a pop and
a push are two) and the paired ratios: kit / C++ at each thread count, and each one's
P threads / 1 thread.

EXP: a checkout of https://github.com/marvinwilliams/multiqueue_experiments; MQ: a
checkout of https://github.com/marvinwilliams/multiqueue (the branch whose
``include/multiqueue/modes/random.hpp`` the harness's wrapper includes: master).
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import sysconfig
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
FLAGS = ["-std=c++17", "-O3", "-DNDEBUG", "-march=native", "-pthread",
         "-DL1_CACHE_LINE_SIZE=64", "-DPAGE_SIZE=4096"]


def _python_flags():
    """(compile flags, link flags) to embed this Python (as python3-config --embed)."""
    inc = [f"-I{sysconfig.get_paths()['include']}"]
    libdir = sysconfig.get_config_var("LIBDIR")
    ver = sysconfig.get_config_var("LDVERSION") or sysconfig.get_python_version()
    libs = (sysconfig.get_config_var("LIBS") or "").split()
    syslibs = (sysconfig.get_config_var("SYSLIBS") or "").split()
    return inc, [f"-L{libdir}", f"-Wl,-rpath,{libdir}", f"-lpython{ver}", *libs, *syslibs]


def build(exp, mq_lib, out_dir):
    """Build (unless present) the harness's ``monotonic`` with the C++ queue and with the
    kit's; returns {"cxx": path, "kit": path}."""
    exp, mq_lib, out_dir = Path(exp), Path(mq_lib), Path(out_dir)
    src = exp / "benchmarks" / "monotonic.cpp"
    if not src.is_file():
        raise ValueError(f"--harness {str(exp)!r}: no benchmarks/monotonic.cpp there; give a "
                         "checkout of multiqueue_experiments")
    if not (mq_lib / "include" / "multiqueue" / "modes" / "random.hpp").is_file():
        raise ValueError(f"--mq-lib {str(mq_lib)!r}: no include/multiqueue/modes/random.hpp; "
                         "give a checkout of the multiqueue library (branch master)")
    out_dir.mkdir(parents=True, exist_ok=True)
    common = [*FLAGS, f"-I{exp / 'benchmarks'}", f"-I{exp}", "-isystem",
              str(exp / "third_party")]
    util = str(exp / "benchmarks" / "util" / "threading.cpp")
    cxx = out_dir / "monotonic_mq_random"
    if not cxx.exists():
        _compile(["g++", *common, "-DPQ_MQ", "-DMQ_MODE_RANDOM", f"-I{mq_lib / 'include'}",
                  f"-I{mq_lib / 'include' / 'multiqueue' / 'third_party' / 'pcg'}", str(src),
                  util, "-o", str(cxx)])
    kit = out_dir / "monotonic_kit"
    if not kit.exists():
        swapped = out_dir / "monotonic_kit.cpp"
        text = src.read_text()
        if '#include "util/selector.hpp"' not in text:
            raise ValueError(f"{src}: no '#include \"util/selector.hpp\"' line to swap")
        swapped.write_text(text.replace('#include "util/selector.hpp"', '#include "kit_mq.hpp"'))
        inc, link = _python_flags()
        _compile(["g++", *common, f"-I{HERE / 'cxx'}", *inc, str(swapped), util, *link,
                  "-o", str(kit)])
    return {"cxx": str(cxx), "kit": str(kit)}


def _compile(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"build failed: {' '.join(cmd)}\n{r.stderr[-3000:]}")


def run_once(binary, threads, prefill, iters, seed, factor=2):
    """One run of a harness binary: M operations/s (2 per iteration) over the harness's
    own clock; ``prefill`` and ``iters`` are totals, split over the threads."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    cmd = [binary, "-j", str(threads), "-p", str(prefill // threads), "-n",
           str(iters // threads), "-s", str(seed), "-c", str(factor)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited with {r.returncode}: {r.stderr[-800:]}")
    res = json.loads(r.stdout.strip().splitlines()[-1])["results"]
    done = sum(t["iterations"] for t in res["thread_data"])
    return 2 * done / (res["time_ns"] / 1e9) / 1e6


def run(binaries, threads=(1, 2), rounds=5, prefill=1 << 20, iters=1 << 21, seed=1, bar=None):
    """``rounds`` rounds, each running both binaries at every thread count in turn (after
    one warm-up round); returns the result rows and the paired ratios."""
    rates = {(name, t): [] for name in binaries for t in threads}
    for rnd in range(rounds + 1):
        for t in threads:
            for name, path in binaries.items():
                r = run_once(path, t, prefill, iters, seed + rnd)
                if rnd:
                    rates[(name, t)].append(r)
                if bar is not None:
                    bar.update()
    rows = [{"competitor": f"{name}-harness", "workers": t, "rates_mops": v,
             "median": statistics.median(v) * 1e6, "min": min(v) * 1e6, "max": max(v) * 1e6}
            for (name, t), v in rates.items()]
    ratios = []
    for t in threads:
        per = [k / c for k, c in zip(rates[("kit", t)], rates[("cxx", t)])]
        ratios.append({"ratio": "kit / C++", "workers": t, "median": statistics.median(per),
                       "per_round": per})
    for name in binaries:
        for t in threads[1:]:
            per = [a / b for a, b in zip(rates[(name, t)], rates[(name, threads[0])])]
            ratios.append({"ratio": f"{name} {t} threads / {threads[0]}", "workers": t,
                           "median": statistics.median(per), "per_round": per})
    return rows, ratios


def main_cli(args, common):
    """``python -m bench mq-harness``: build, run, print, write the JSON."""
    from tqdm import tqdm
    out = Path(args.build_dir)
    bins = build(args.harness, args.mq_lib, out)
    threads = tuple(common.parse_counts(args.workers)) if args.workers else (1, 2)
    bar = tqdm(total=(args.reps + 1) * len(threads) * 2, desc="mq-harness", leave=False)
    rows, ratios = run(bins, threads, args.reps, args.prefill_total, args.iters_total,
                       args.seed + 1, bar)
    bar.close()
    print(f"\nthe harness's monotonic hold loop ({args.prefill_total:,} prefilled, "
          f"{args.iters_total:,} iterations = {2 * args.iters_total:,} operations in all, "
          f"2 queues per thread), M ops/s, median [min-max] of {args.reps} rounds")
    for r in rows:
        print(f"  {r['competitor']:14s} {r['workers']} thread(s): {r['median'] / 1e6:6.2f} "
              f"[{r['min'] / 1e6:.2f}-{r['max'] / 1e6:.2f}]")
    for r in ratios:
        label = r["ratio"] + (f" at {r['workers']}" if r["ratio"] == "kit / C++" else "")
        print(f"  {label:28s} {r['median']:.2f}x  (rounds: "
              + " ".join(f"{x:.2f}" for x in r["per_round"]) + ")")
    hdr = common.header(args)
    path = common.write_json("mq-harness", hdr, rows,
                             {"ratios": ratios, "prefill_total": args.prefill_total,
                              "iters_total": args.iters_total, "queues_per_thread": 2,
                              "binaries": bins})
    print(f"\nwrote {path}", file=sys.stderr)


#: the benchmarks page lists each round's ratio for runs of at most this many rounds
MAX_LISTED = 25


def summary_markdown(d):
    """The benchmarks page's table: M ops/s per binary and thread count, then the ratios."""
    rows = d["results"]
    ts = sorted({r["workers"] for r in rows})
    out = ["| queue in the harness | " + " | ".join(f"{t} thread{'s' if t > 1 else ''}"
                                                    for t in ts) + " |",
           "|---|" + "---:|" * len(ts)]
    for c in dict.fromkeys(r["competitor"] for r in rows):
        cells = [next((f"{r['median'] / 1e6:.2f} M ({r['min'] / 1e6:.2f}–{r['max'] / 1e6:.2f})"
                       for r in rows if r["competitor"] == c and r["workers"] == t), "–")
                 for t in ts]
        out.append(f"| {c} | " + " | ".join(cells) + " |")
    out += ["", "| ratio (paired by round) | median | quartiles | rounds |", "|---|---:|---:|---|"]
    for r in d["ratios"]:
        label = r["ratio"] + (f", {r['workers']} thread(s)" if r["ratio"] == "kit / C++" else "")
        per = r["per_round"]
        qs = statistics.quantiles(per, n=4) if len(per) > 1 else [per[0]] * 3
        q1, q3 = qs[0], qs[2]
        listed = (" ".join(f"{x:.2f}" for x in per) if len(per) <= MAX_LISTED
                  else f"{len(per)} (each in the JSON)")
        out.append(f"| {label} | {r['median']:.2f}x | {q1:.2f}–{q3:.2f} | {listed} |")
    h = d["header"]
    out += ["", f"{d['prefill_total']:,} keys prefilled, {d['iters_total']:,} iterations "
            f"({2 * d['iters_total']:,} operations) in all, {d['queues_per_thread']} queues "
            f"per thread; median (min–max) of {h['reps']} interleaved rounds after a warm-up; "
            f"{h['cpu']}, {h['cpu_count']} CPUs, `{h['command']}`."]
    return "\n".join(out)
