"""Scalability and quality microbenchmarks: ``python -m bench SCENARIO [options]``.

Each scenario is a subcommand with its own options (``python -m bench SCENARIO --help``)
and writes bench/results/<scenario>.json; ``all`` runs every scenario (taking every
option), then ``plot``, which draws the PNGs and docs/benchmarks.md.

Examples:
  python -m bench all                       # 1..CPU count workers, 5 repetitions
  python -m bench pq-threads --workers 1-16 --reps 7
  python -m bench pq-threads --only mq-nogil --cxx-mq ./mq_hold   # beside the C++ MultiQueue
  python -m bench mis --mis-parts "" --pbbs ~/pbbsbench          # beside PBBS, speed only
  python -m bench plot                      # PNGs and docs/benchmarks.md from the JSON
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
import time

import numpy as np
from tqdm import tqdm

from bench import common
from sgd_shm._argtypes import finite_float, out_dir, seed_int
from bench.common import Series, fmt_rate


def _workers(args):
    return common.parse_counts(args.workers) if args.workers else list(range(1, (os.cpu_count() or 1) + 1))


def _measure(comp_objs, workers_list, args, kind, iters_of):
    """Interleaved repetitions: for each worker count, every competitor once per rep."""
    from bench import pq
    runner = pq.run_threads if kind == "threads" else pq.run_processes
    rows = []
    total = sum(len(comp_objs) * (args.reps + 1) for _ in workers_list)
    bar = tqdm(total=total, desc=kind, unit="run", leave=False)
    for T in workers_list:
        built = []
        for c in comp_objs:
            s = c.build(T, shared=True) if kind == "processes" else c.build(T)
            built.append((c, s, Series(c.name, {"workers": T, "iters_per_worker": iters_of(c)})))
        for rep in range(args.reps + 1):            # rep 0 is the warm-up
            for c, s, ser in built:
                if getattr(c, "external", False):     # its own process does the loop
                    rate = c.run(T, iters_of(c), args.seed + rep)
                else:
                    rate = runner(c, s, T, iters_of(c), args.seed + rep)
                if rep:
                    ser.rates.append(rate)
                bar.update()
        for c, s, ser in built:
            c.close(s)
            rows.append(ser.summary())
    bar.close()
    return rows


def _table(rows, title):
    print(f"\n{title}")
    comps = list(dict.fromkeys(r["competitor"] for r in rows))
    ws = sorted({r["workers"] for r in rows})
    name_w = max([24] + [len(c) + 1 for c in comps])
    print(f"{'competitor':{name_w}s}" + "".join(f"{f'{w} worker(s)':>30s}" for w in ws))
    for c in comps:
        line = f"{c:{name_w}s}"
        for w in ws:
            r = next((r for r in rows if r["competitor"] == c and r["workers"] == w), None)
            cell = (f"{fmt_rate(r['median'])} [{fmt_rate(r['min'])}–{fmt_rate(r['max'])}]"
                    if r else "-")
            line += f"{cell:>30s}"
        print(line)


def cmd_pq(args, kind):
    from bench import pq
    rng = np.random.default_rng(args.seed)
    prefill = rng.integers(0, pq.KEY_RANGE, args.prefill)
    classes = pq.THREAD_COMPETITORS if kind == "threads" else pq.PROCESS_COMPETITORS
    if args.only:
        classes = [c for c in classes if c.name in args.only.split(",")]
    comps = [c(prefill) for c in classes]
    if kind == "threads" and args.cxx_mq:
        for cls in (pq.CxxMQ, pq.CxxMQSticky):
            cxx = cls(prefill)
            cxx.path = args.cxx_mq
            comps.append(cxx)
    for c in comps:
        if isinstance(c, (pq.MQSticky, pq.CxxMQSticky)):
            c.stickiness = args.stickiness

    def iters_of(c):
        if c.name == "manager-pq":
            return args.manager_iters
        return args.py_iters if c.python_level else args.iters
    hdr = common.header(args)
    common.print_header(hdr)
    rows = _measure(comps, _workers(args), args, kind, iters_of)
    _table(rows, f"hold-model throughput, ops/s, median [min–max] of {args.reps} ({kind})")
    if kind == "threads":
        _rank_errors(comps, rows, args)
    path = common.write_json(f"pq-{kind}", hdr, rows)
    print(f"\nwrote {path}")


RANK_RUNS = 5


def _rank_errors(comps, rows, args):
    """The rank error of each kit MultiQueue configuration just timed (same queues,
    threads and stickiness; logged runs of --quality-iters pairs per thread), so a
    speed-up is read beside the relaxation it costs. As in the quality scenario, a run
    in which a thread paused over 1 ms (descheduled, maybe holding a lock) is set
    apart: rank_error_mean is the median over the undisturbed runs (over all runs if
    none was), every run's mean and pause are kept."""
    todo = [(c, r) for c in comps if getattr(c, "rank_error", False)
            for r in rows if r["competitor"] == c.name]
    if not todo:
        return
    print(f"\nrank error of the same configurations (mean over the pops of a logged run, "
          f"{args.quality_iters:,} pairs per thread; median of the runs in which no thread "
          f"paused over 1 ms, of {RANK_RUNS})")
    bar = tqdm(total=len(todo) * RANK_RUNS, desc="rank error", leave=False)
    for c, r in todo:
        T = r["workers"]
        means, paused = [], []
        for rep in range(RANK_RUNS):
            rank, _, gap_us = _quality_run(T, c.n_queues(T), c.stickiness, args, args.seed + rep)
            means.append(float(rank.mean()))
            paused.append(bool(gap_us > 1000))
            bar.update()
        calm = [m for m, p in zip(means, paused) if not p]
        r.update(queues=c.n_queues(T), stickiness=c.stickiness,
                 rank_error_mean=float(np.median(calm or means)), rank_error_runs=means,
                 rank_error_paused=paused, rank_error_undisturbed_runs=len(calm))
        tqdm.write(f"{c.name:24s} {T:2d} worker(s), {c.n_queues(T):2d} queues, stickiness "
                   f"{c.stickiness:2d}: {r['rank_error_mean']:.2f} ({len(calm)} undisturbed, "
                   f"all runs {' '.join(f'{m:.2f}' for m in means)})")
    bar.close()


def _quality_run(T, q, stick, args, seed):
    """One logged hold run with T threads; returns (rank errors, delays)."""
    from relaxed import MultiQueue
    from relaxed.quality import logged_hold, merge_logs, replay
    rng = np.random.default_rng(seed)
    n = args.prefill
    init = rng.integers(0, 1 << 32, n)
    mq = MultiQueue(n + T, n_queues=q, seed=seed, stickiness=stick)
    mq.push_many(init, np.arange(n))
    logs, lens = logged_hold(mq, T, args.quality_iters, (1 << 32) - 1)
    mq._check()
    mq.close()
    ticks, ops, keys, vals = merge_logs(logs, lens)
    rank, delay = replay(ticks, ops, keys, vals, init, np.arange(n))
    # the longest pause inside any thread's own log: a thread descheduled while it
    # holds a queue's lock freezes that queue, and pops skip past its small keys
    gap = max(int(np.diff(lg[:ln, 0]).max()) if ln > 1 else 0 for lg, ln in zip(logs, lens))
    return rank, delay, gap / _ticks_per_us()


_TPU = []


def _ticks_per_us():
    """Rate of the log's timestamp counter (rdtsc), calibrated once against perf_counter."""
    if not _TPU:
        from relaxed import MultiQueue
        mq = MultiQueue(4, n_queues=1)
        log = np.zeros((4, 4), dtype=np.int64)
        mq.push(0, 0)
        t0 = time.perf_counter()
        mq._hold(1, 1, log=log)
        time.sleep(0.2)
        t1 = time.perf_counter()
        mq._hold(1, 1, log=log[2:])
        mq.close()
        _TPU.append((log[2, 0] - log[0, 0]) / ((t1 - t0) * 1e6))
    return _TPU[0]


def cmd_quality(args):
    from relaxed.quality import theory_rank_error
    hdr = common.header(args)
    common.print_header(hdr)
    rows, cdfs = [], {}
    print(f"\nrank error and delay (hold model, prefill {args.prefill:,}, "
          f"{args.quality_iters:,} pop/push pairs per thread; median over {args.reps} runs, "
          f"worst run's mean in brackets)")
    print("('undisturbed': median over the runs in which no thread paused > 1 ms, "
          "with their count)")
    print(f"{'threads':>7s} {'queues':>6s} {'stick':>5s} {'rank mean':>16s} {'undisturbed':>12s} "
          f"{'p50':>5s} {'p99':>6s} {'max':>6s} {'theory':>7s} {'delay mean':>10s} {'p99':>6s}")
    settings = sorted({(T, q, s) for T in _workers(args) for q in (1, 2 * T, 4, 8, 16)
                       for s in ((1, 8) if q == 8 else (1,))})
    bar = tqdm(total=len(settings) * args.reps, desc="quality", leave=False)
    for T, q, stick in settings:
        runs = []
        for rep in range(args.reps):
            rank, delay, gap_us = _quality_run(T, q, stick, args, args.seed + rep)
            runs.append({"rank_mean": float(rank.mean()),
                         "rank_p50": float(np.percentile(rank, 50)),
                         "rank_p99": float(np.percentile(rank, 99)),
                         "rank_max": int(rank.max()),
                         "delay_mean": float(delay.mean()),
                         "delay_p99": float(np.percentile(delay, 99)),
                         "delay_max": int(delay.max()),
                         "frac_rank_over_100": float((rank > 100).mean()),
                         "max_gap_us": float(gap_us),
                         "preempted": bool(gap_us > 1000)})
            if rep == 0:
                vals_, counts = np.unique(np.minimum(rank, 1000), return_counts=True)
                cdfs[f"{T}t-{q}q-s{stick}"] = {"rank": vals_.tolist(),
                                               "cdf": (np.cumsum(counts) / counts.sum()).tolist()}
            bar.update()
        row = {"threads": T, "queues": q, "stickiness": stick,
               "theory_rank_mean": theory_rank_error(q), "pops_per_run": T * args.quality_iters,
               "runs": runs}
        for key in runs[0]:
            if key != "preempted":
                row[key] = float(np.median([r[key] for r in runs]))
        row["worst_rank_mean"] = max(r["rank_mean"] for r in runs)
        calm = [r["rank_mean"] for r in runs if not r["preempted"]]
        row["undisturbed_runs"] = len(calm)
        row["undisturbed_rank_mean"] = float(np.median(calm)) if calm else None
        rows.append(row)
        mean_cell = f"{row['rank_mean']:.2f} [{row['worst_rank_mean']:.1f}]"
        calm_cell = (f"{row['undisturbed_rank_mean']:.2f} ({len(calm)})" if calm else "- (0)")
        tqdm.write(f"{T:7d} {q:6d} {stick:5d} {mean_cell:>16s} {calm_cell:>12s} "
                   f"{row['rank_p50']:5.0f} {row['rank_p99']:6.0f} {row['rank_max']:6.0f} "
                   f"{row['theory_rank_mean']:7.2f} {row['delay_mean']:10.2f} "
                   f"{row['delay_p99']:6.0f}")
    bar.close()
    path = common.write_json("quality", hdr, rows, {"rank_cdf": cdfs})
    print(f"\nwrote {path}")


def cmd_counter(args):
    from bench import counter
    hdr = common.header(args)
    common.print_header(hdr)
    rows, errs = counter.run(args, _workers(args))
    _table(rows, f"counter increments, ops/s, median [min–max] of {args.reps}")
    print("\nread() error under 2 incrementing threads (|read − exact| / n_counters):")
    for e in errs:
        print(f"  m={e['n_counters']:5d} stickiness {e['stickiness']:3d}: mean {e['mean']:.2f}  "
              f"p99 {e['p99']:.2f}  "
              f"max {e['max']:.2f}  bound/m {e['bound_per_counter']:.1f}")
    path = common.write_json("counter", hdr, rows, {"read_error": errs})
    print(f"\nwrote {path}")


def cmd_hogwild(args):
    from bench import hogwild
    hdr = common.header(args)
    common.print_header(hdr)
    rows, extra, (X, y) = hogwild.run(args, _workers(args))   # (X, y): for --torch
    p = extra["problem"]
    print(f"\nHogwild, log loss, {p['n_samples']:,} x {p['n_features']:,} "
          f"({p['nnz'] / 1e6:.1f}M nonzeros), {args.epochs} epochs, median of {args.reps}; "
          f"target held-out accuracy {extra['target_val_accuracy']:.4f} (sklearn's final "
          f"- {extra['target_gap']:g})")
    print(f"{'competitor':20s} {'workers':>7s} {'epoch s':>8s} {'vs sklearn':>10s} "
          f"{'vs 1 (paired)':>13s} {'held-out acc':>12s} {'train loss':>10s} "
          f"{'time to target s':>16s}")
    sk = next(r for r in rows if r["competitor"] == "sklearn")
    for r in rows:
        ttt = f"{r['time_to_target_s']:.3f}" if r["time_to_target_s"] is not None else "not reached"
        sp1 = f"{r['speedup_vs_1']:.2f}x" if "speedup_vs_1" in r and r["workers"] > 1 else "-"
        print(f"{r['competitor']:20s} {r['workers']:7d} {r['epoch_s_median']:8.3f} "
              f"{sk['epoch_s_median'] / r['epoch_s_median']:9.2f}x {sp1:>13s} "
              f"{r['final_val_accuracy']:12.4f} {r['final_train_loss']:10.4f} {ttt:>16s}")
    hogwild.print_fits(extra["fits"], extra["free_cores_before_after_fits"])
    hl = extra["hot_layout_s"]
    if hl["hot_features"] == p["n_features"]:
        rows_s = f"every feature buffered, rows read in place {hl['hot_s']:.3f} s, "
    elif hl["hot_features"]:
        rows_s = (f"hot-first rows ({hl['hot_features']} hot features) {hl['hot_s']:.3f} s "
                  f"(kept from the last fit: {hl['hot_reused_s']:.3f} s), ")
    else:
        rows_s = "(no hot features at this size) "
    print("\nbuilding the rows per fit, not in the epoch times: " + rows_s +
          f"plain rows {hl['plain_s']:.3f} s")
    hogwild.print_sweep(extra["hot_sweep"])
    print("\nstaleness (updates by other workers between a read and its write):")
    for k, v in extra["staleness"].items():
        print(f"  {k:14s} mean tau {v['mean_tau']:.2f}, tau = 0 for {100 * v['frac_tau0']:.1f}% "
              f"of {v['updates']:,} updates, largest bin {v['max_tau_bin']}")
    if args.torch:
        from bench import torch_hogwild
        runs = []
        for T in _workers(args):
            t, loss = torch_hogwild.epoch_seconds(X, y, T, batch=args.torch_batch,
                                                  seed=args.seed)
            runs.append({"workers": T, "epoch_s": t, "train_loss": loss})
            print(f"PyTorch Hogwild (mnist_hogwild style, batch {args.torch_batch}), {T} "
                  f"process(es): {t:.2f} s per epoch")
        import torch
        extra["torch"] = {"version": torch.__version__, "batch": args.torch_batch, "lr": 0.1,
                          "runs": runs}
    path = common.write_json("hogwild", hdr, rows, extra)
    print(f"\nwrote {path}")


def cmd_mis(args):
    from bench import mis
    hdr = common.header(args)
    common.print_header(hdr)
    workers = _workers(args)
    sizes = common.parse_counts(args.waste_sizes)
    queues = [2, 4, 8, 16, 32, 64]
    ks = [1, 2, 4, 8, 16, 32, 64]
    seeds = list(range(args.seed, args.seed + args.waste_seeds))
    parts = args.mis_parts.split(",")
    waste_rows, slopes = (mis.waste(sizes, queues, ks, seeds, degree=args.mis_degree)
                          if "waste" in parts else ([], {}))
    speed_rows, problem = mis.speed(args.mis_n, args.mis_m, workers, args.reps, args.seed,
                                    pbbs=args.pbbs, multiqueue="multiqueue" in parts)
    nx = (mis.versus_networkx(args.nx_n, args.nx_n * args.mis_m // args.mis_n, args.seed)
          if "networkx" in parts else None)
    d = {"header": hdr, "waste": waste_rows, "slopes": slopes, "speed": speed_rows,
         "speed_problem": problem, "networkx": nx, "degree": args.mis_degree}
    print()
    print(mis.summary_markdown(d))
    path = common.write_json("mis", hdr, speed_rows,
                             {k: v for k, v in d.items() if k not in ("header",)})
    print(f"\nwrote {path}")


def cmd_conflict(args):
    from bench import conflict
    common.print_header(common.header(args))
    res = conflict.run(args.reps, args.seed, common.results_dir(), quick=args.quick)
    print(conflict.summary_markdown(res))
    print(f"\nwrote {common.results_dir() / 'conflict.json'}")


def _scenario(args, name, measure):
    """Print the header, ``measure(module) -> (rows, extra)``, print the module's
    markdown summary and write bench/results/<name>.json."""
    mod = importlib.import_module(f"bench.{name}")
    hdr = common.header(args)
    common.print_header(hdr)
    rows, extra = measure(mod)
    print()
    print(mod.summary_markdown({"header": hdr, "results": rows, **extra}))
    path = common.write_json(name, hdr, rows, extra)
    print(f"\nwrote {path}")


def cmd_stm(args):
    def measure(stm):
        rows = stm.run(_workers(args), args.reps, args.seed, n_tx=args.stm_tx)
        return rows, {"ratios": stm.ratios(rows)}
    _scenario(args, "stm", measure)


def cmd_delay(args):
    _scenario(args, "delay", lambda delay: delay.run(args.seed, n=args.delay_samples))


def cmd_mf(args):
    _scenario(args, "mf", lambda mf: mf.run(
        _workers(args), args.reps, args.seed, users=args.mf_users, items=args.mf_items,
        ratings=args.mf_ratings, epochs=args.mf_epochs))


def cmd_ps(args):
    def measure(ps):
        # --quick: one repetition of runs of at most 1 s without the warm-up, short
        # transport loops
        rows, extra = ps.run(args.ps_workers, 1 if args.quick else args.reps, args.seed,
                             samples=args.ps_samples, features=args.ps_features,
                             seconds=min(args.ps_seconds, 1.0) if args.quick else args.ps_seconds,
                             target=args.ps_target, tight=args.ps_tight, loose=args.ps_loose,
                             backends=ps.backends_of(args.backend),
                             transport_seconds=0.3 if args.quick else 1.0,
                             warmup=not args.quick)
        return rows, {**extra, "ratios": ps.ratios(rows)}
    try:
        _scenario(args, "ps", measure)
    finally:
        if args.backend != "shm":
            import ray
            ray.shutdown()


def cmd_eager(args):
    # --quick: one repetition, a 1 MB buffer, trainer runs of 1 s
    _scenario(args, "eager", lambda eager: eager.run(
        1 if args.quick else args.reps, args.seed,
        seconds=1.0 if args.quick else args.eager_seconds, target=args.eager_target,
        imbalance=(1, args.eager_sleep), quick=args.quick))


def _has_torch(args, name):
    """Whether torch is there for scenario ``name``: without it ``all`` leaves the
    scenario out (saying so) and the scenario alone exits naming the extra."""
    if importlib.util.find_spec("torch") is not None:
        return True
    if args.scenario == "all":
        print(f"({name} left out: torch is not installed)", file=sys.stderr)
        return False
    sys.exit(f"{name} needs torch: pip install 'relaxed-sgd-kit[torch]'")


def cmd_torch_ddp(args):
    # --quick: 1 repetition without the warm-up run, 1 epoch of each part
    if not _has_torch(args, "torch_ddp"):
        return
    reps = 1 if args.quick else args.reps
    epochs = 1 if args.quick else args.torch_ddp_epochs
    _with_reps(args, reps, "torch_ddp", lambda torch_ddp: torch_ddp.run(
        reps, args.seed, ranks=args.torch_ddp_ranks, data=args.torch_ddp_data,
        epochs=epochs, compress_epochs=1 if args.quick else args.torch_ddp_compress_epochs,
        imbalance=(1, args.torch_ddp_sleep), target=args.torch_ddp_target,
        lr=args.torch_ddp_lr, momentum=args.torch_ddp_momentum, late=args.torch_ddp_late,
        average=args.torch_ddp_average, warmup=not args.quick))


def cmd_torch_nets(args):
    # --quick: 1 repetition without the warm-up run, 4,000 images
    if not _has_torch(args, "torch_nets"):
        return
    reps = 1 if args.quick else args.reps
    _with_reps(args, reps, "torch_nets", lambda torch_nets: torch_nets.run(
        reps, args.seed, quick=args.quick, warmup=not args.quick))


def _with_reps(args, reps, name, measure):
    """_scenario with ``reps`` repetitions (what the header reports), leaving
    ``args.reps`` as it was for the scenarios after this one."""
    saved, args.reps = getattr(args, "reps", None), reps
    try:
        _scenario(args, name, measure)
    finally:
        args.reps = saved


def cmd_compress(args):
    reps = 1 if args.quick else args.compress_reps

    def measure(compress):
        from bench.eager import mpiexec
        mpi = None if args.no_mpi else mpiexec()
        if args.quick:      # one repetition, the small problem, 2 epochs, 100k-entry vectors
            return compress.run(1, args.seed, problems=("small",), ratios=(1e-3, 1e-2),
                                epochs=2, speed_n=100_000, mpi=mpi)
        return compress.run(reps, args.seed, mpi=mpi)
    _with_reps(args, reps, "compress", measure)


def cmd_unreliable(args):
    # --quick: p in {0, 0.1, 0.3}, S in {1, 4}, one seed, runs of 1 epoch
    reps = 1 if args.quick else args.reps
    _with_reps(args, reps, "unreliable", lambda unreliable: unreliable.run(
        reps, args.seed, samples=args.ps_samples, features=args.ps_features,
        workers=args.ps_workers, epochs=1 if args.quick else args.unreliable_epochs,
        quick=args.quick))


def cmd_nonconvex(args):
    # --quick: 3 epochs of digits, 2 of a small non-linear problem, one repetition
    reps = 1 if args.quick else args.reps
    _with_reps(args, reps, "nonconvex", lambda nonconvex: nonconvex.run(
        reps, args.seed, quick=args.quick))


def cmd_schedules(args):
    # --quick: 1 seed, 1 epoch per run
    if not _has_torch(args, "schedules"):
        return
    reps = 1 if args.quick else args.reps
    _with_reps(args, reps, "schedules", lambda schedules: schedules.run(
        reps, args.seed, quick=args.quick))


def cmd_clock(args):
    # --quick: one repetition of runs of 0.2 s
    reps = 1 if args.quick else args.reps
    _with_reps(args, reps, "clock", lambda clock: clock.run(
        _workers(args), reps, args.seed, seconds=0.2 if args.quick else args.clock_seconds))


def cmd_sim(args):
    from bench.sim import PARTS
    parts = [p for p in args.sim_parts.split(",") if p] if args.sim_parts else list(PARTS)
    if not parts:                                 # (",": ran nothing, wrote an empty file)
        sys.exit(f"--sim-parts {args.sim_parts!r} names no part; use {', '.join(PARTS)}")
    bad = sorted(set(parts) - set(PARTS))
    if bad:
        sys.exit(f"--sim-parts: unknown {bad}; use {', '.join(PARTS)}")
    reps = 1 if args.quick else args.reps
    _with_reps(args, reps, "sim", lambda sim: sim.run(reps, args.seed, parts, quick=args.quick))


def cmd_plot(args):
    from bench import plot, report
    for p in plot.plot_all():
        print(f"wrote {p}")
    print(f"wrote {report.write_page()}")


#: every option: dest -> (flag, argparse keywords); a scenario takes the ones it names
FLAGS = {
    "workers": ("--workers", dict(default=None, help="worker counts, e.g. '1,2,4' or '1-16' "
                                  "(default 1..CPU count)")),
    "reps": ("--reps", dict(type=int, default=5,
                            help="repetitions after a warm-up (default 5)")),
    "seed": ("--seed", dict(type=seed_int, default=0, help="seed (default 0)")),
    "prefill": ("--prefill", dict(type=int, default=1_000_000,
                                  help="prefill size (default 1M)")),
    "iters": ("--iters", dict(type=int, default=1_000_000,
                              help="pop/push pairs per worker, compiled competitors "
                                   "(counter: 4x as many increments) (default 1M)")),
    "py_iters": ("--py-iters", dict(type=int, default=200_000,
                                    help="pop/push pairs per worker, Python-level "
                                         "competitors (default 200k)")),
    "manager_iters": ("--manager-iters", dict(type=int, default=2_000,
                                              help="pop/push pairs per worker through a "
                                                   "Manager proxy (default 2000)")),
    "quality_iters": ("--quality-iters", dict(type=int, default=200_000,
                                              help="logged pop/push pairs per thread for the "
                                                   "rank error (default 200k)")),
    "only": ("--only", dict(default=None, help="comma-separated competitor names")),
    "stickiness": ("--stickiness", dict(type=int, default=8,
                                        help="stickiness of mq-sticky and cxx-mq-sticky "
                                             "(default 8)")),
    "cxx_mq": ("--cxx-mq", dict(default=None, metavar="PATH",
                                help="also run this C++ MultiQueue hold-loop binary (built "
                                     "from bench/cxx/mq_hold.cpp, see its first lines), "
                                     "interleaved with the kit")),
    "epochs": ("--epochs", dict(type=int, default=5, help="epochs per Hogwild run (default 5)")),
    "sgd_samples": ("--sgd-samples", dict(type=int, default=200_000,
                                          help="rows of the RCV1-like problem (default 200000)")),
    "sgd_features": ("--sgd-features", dict(type=int, default=50_000,
                                            help="columns of the RCV1-like problem "
                                                 "(default 50000)")),
    "torch": ("--torch", dict(action="store_true", help="also time PyTorch Hogwild "
                              "(mnist_hogwild style; needs torch)")),
    "torch_batch": ("--torch-batch", dict(type=int, default=32,
                                          help="minibatch of the PyTorch reference (default 32)")),
    "cxx": ("--cxx", dict(action="store_true",
                          help="also time a plain C++ Hogwild (bench/cxx/hogwild.cpp, built "
                               "with g++ -O3 -march=native) side by side")),
    "mis_n": ("--mis-n", dict(type=int, default=1_000_000,
                              help="vertices of the MIS speed graph (default 1M)")),
    "mis_m": ("--mis-m", dict(type=int, default=10_000_000,
                              help="edges of the MIS speed graph (default 10M)")),
    "mis_degree": ("--mis-degree", dict(type=int, default=10, help="average degree of the "
                                        "wasted-work graphs (default 10)")),
    "mis_parts": ("--mis-parts", dict(default="waste,multiqueue,networkx",
                                      help="parts beside the speed table (the sequential "
                                           "loops and the prefix engine): any of waste, "
                                           "multiqueue, networkx (default all three)")),
    "pbbs": ("--pbbs", dict(default=None, metavar="PATH",
                            help="also run PBBS's MIS and matching binaries, built in this "
                                 "pbbsbench checkout (github.com/cmuparlay/pbbsbench), "
                                 "interleaved with the kit on the same graph and priorities")),
    "waste_sizes": ("--waste-sizes", dict(default="10000,100000,1000000",
                                          help="graph sizes n for wasted work "
                                               "(default 10000,100000,1000000)")),
    "waste_seeds": ("--waste-seeds", dict(type=int, default=10,
                                          help="seeds per wasted-work point (default 10)")),
    "nx_n": ("--nx-n", dict(type=int, default=100_000,
                            help="vertices for the networkx comparison (default 100k)")),
    "stm_tx": ("--stm-tx", dict(type=int, default=100_000,
                                help="transactions per worker per TL2 run (default 100k)")),
    "delay_samples": ("--delay-samples", dict(type=int, default=20_000,
                                              help="rows of the delay study's problem "
                                                   "(default 20000)")),
    "mf_users": ("--mf-users", dict(type=int, default=100_000, help="MF users (default 100k)")),
    "mf_items": ("--mf-items", dict(type=int, default=10_000, help="MF items (default 10k)")),
    "mf_ratings": ("--mf-ratings", dict(type=int, default=2_000_000,
                                        help="MF ratings (default 2M)")),
    "mf_epochs": ("--mf-epochs", dict(type=int, default=3, help="MF epochs per fit (default 3)")),
    "ps_workers": ("--ps-workers", dict(type=int, default=4,
                                        help="parameter-server workers (default 4)")),
    "ps_samples": ("--ps-samples", dict(type=int, default=20_000,
                                        help="rows of the PS problem (default 20000)")),
    "ps_features": ("--ps-features", dict(type=int, default=2_000,
                                          help="columns of the PS problem (default 2000)")),
    "ps_seconds": ("--ps-seconds", dict(type=finite_float, default=4.0,
                                        help="seconds per PS run (default 4)")),
    "ps_target": ("--ps-target", dict(type=finite_float, default=0.935,
                                      help="target held-out accuracy (default 0.935)")),
    "ps_tight": ("--ps-tight", dict(type=finite_float, default=0.94, help="tighter target held-out "
                                    "accuracy, also reported (default 0.94)")),
    "ps_loose": ("--ps-loose", dict(type=finite_float, default=0.93, help="looser target held-out "
                                    "accuracy, also reported (default 0.93)")),
    "backend": ("--backend", dict(choices=["shm", "ray", "both"], default="shm",
                                  help="the parameter server's transport: shared memory, Ray "
                                       "or both side by side (default shm)")),
    "eager_seconds": ("--eager-seconds", dict(type=finite_float, default=3.0,
                                              help="seconds per eager-SGD trainer run "
                                                   "(default 3)")),
    "eager_target": ("--eager-target", dict(type=finite_float, default=0.935,
                                            help="eager-SGD target held-out accuracy "
                                                 "(default 0.935)")),
    "eager_sleep": ("--eager-sleep", dict(type=finite_float, default=0.002,
                                          help="seconds the rank drawn each round sleeps "
                                               "(default 0.002)")),
    "compress_reps": ("--compress-reps", dict(type=int, default=3, help="repetitions of every "
                                              "training run (default 3)")),
    "no_mpi": ("--no-mpi", dict(action="store_true",
                                help="leave out the eager runs under mpiexec")),
    "torch_ddp_ranks": ("--torch-ddp-ranks", dict(type=int, default=2,
                                                  help="DDP processes per run (default 2)")),
    "torch_ddp_data": ("--torch-ddp-data", dict(choices=("digits", "augmented"),
                                                default="digits",
                                                help="sklearn's digits or the 50,000-image "
                                                     "augmented set (default digits)")),
    "torch_ddp_epochs": ("--torch-ddp-epochs", dict(type=int, default=15,
                                                    help="epochs per imbalance run "
                                                         "(default 15)")),
    "torch_ddp_compress_epochs": ("--torch-ddp-compress-epochs", dict(
        type=int, default=30, help="epochs per compression run (default 30)")),
    "torch_ddp_sleep": ("--torch-ddp-sleep", dict(type=finite_float, default=0.05,
                                                  help="seconds one rank per step sleeps "
                                                       "(default 0.05)")),
    "torch_ddp_target": ("--torch-ddp-target", dict(type=finite_float, default=0.95,
                                                    help="target held-out accuracy "
                                                         "(default 0.95)")),
    "torch_ddp_late": ("--torch-ddp-late", dict(choices=("drop", "carry"), default="drop",
                                                help="a late gradient in the partial hooks "
                                                     "(default drop)")),
    "torch_ddp_average": ("--torch-ddp-average", dict(choices=("size", "contributors"),
                                                      default="contributors",
                                                      help="the partial hooks' mean: over "
                                                           "the ranks or the round's "
                                                           "contributors (default "
                                                           "contributors)")),
    "torch_ddp_lr": ("--torch-ddp-lr", dict(type=finite_float, default=0.2,
                                            help="SGD step (default 0.2)")),
    "torch_ddp_momentum": ("--torch-ddp-momentum", dict(type=finite_float, default=0.0,
                                                        help="SGD momentum; the compression "
                                                             "hook applies it as DGC's "
                                                             "momentum correction (default 0)")),
    "unreliable_epochs": ("--unreliable-epochs", dict(type=int, default=5,
                                                      help="epochs per run, the work every "
                                                           "run does (default 5)")),
    "clock_seconds": ("--clock-seconds", dict(type=finite_float, default=1.0,
                                              help="seconds per clock run (default 1)")),
    "sim_parts": ("--sim-parts", dict(default="", help="comma-separated parts of the sim "
                                      "scenario: saps, eager, rps, topk, speed, calibrate "
                                      "(default all)")),
    "quick": ("--quick", dict(action="store_true", help="a short run (see the scenario)")),
    "out": ("--out", dict(default=None, help="results folder (default bench/results)")),
    "label": ("--label", dict(default=None, metavar="NAME",
                              help="keep this run beside the main one: write "
                                   "<scenario>@NAME.json (e.g. another machine's run), which "
                                   "the benchmarks page shows under the scenario; the plots "
                                   "keep to the main run")),
}

#: what --quick does, per scenario
QUICK = {"conflict": "fewer samples",
         "ps": "1 repetition of runs of at most 1 s, short transport loops",
         "eager": "1 repetition, a 1 MB buffer, trainer runs of 1 s",
         "torch_ddp": "1 repetition, no warm-up run, 1 epoch per run",
         "torch_nets": "1 repetition, no warm-up run, 4,000 images",
         "compress": "1 repetition on the small problem, 2 epochs, 100k-entry vectors",
         "unreliable": "p in {0, 0.1, 0.3}, S in {1, 4}, one seed, 1 epoch",
         "nonconvex": "3 epochs of digits, 2 of a small non-linear problem, 1 repetition",
         "clock": "1 repetition of runs of 0.2 s",
         "sim": "1 seed, 16-64 simulated workers, small problems, 1-2 epochs",
         "schedules": "1 seed, 1 epoch per run"}

_RUN = ["workers", "reps", "seed"]
_PQ = ["prefill", "iters", "py_iters"]
_PS = ["ps_workers", "ps_samples", "ps_features"]
#: scenario -> (one line for the list, the options it takes besides --out and --label)
SCENARIOS = {
    "pq-threads": ("MultiQueue hold-model throughput vs threads, beside heapq+Lock and "
                   "queue.PriorityQueue", _RUN + _PQ + ["quality_iters", "only", "stickiness",
                                                         "cxx_mq"]),
    "pq-processes": ("the same across processes sharing one MultiQueue, beside a Manager "
                     "queue", _RUN + _PQ + ["manager_iters", "only"]),
    "quality": ("rank error and delay of pops, replayed from per-thread logs",
                _RUN + ["prefill", "quality_iters"]),
    "counter": ("MultiCounter increments vs threads/processes, and read() error",
                _RUN + ["iters", "py_iters"]),
    "hogwild": ("Hogwild SGD epoch time and time to a held-out accuracy vs workers, beside "
                "scikit-learn", _RUN + ["epochs", "sgd_samples", "sgd_features", "torch",
                                        "torch_batch", "cxx"]),
    "mis": ("greedy MIS / matching: wasted work vs q, k, n; time vs threads",
            _RUN + ["mis_n", "mis_m", "mis_degree", "mis_parts", "pbbs", "waste_sizes",
                    "waste_seeds", "nx_n"]),
    "conflict": ("competitive ratios of the ski-rental conflict policies (simulator)",
                 ["reps", "seed", "quick"]),
    "stm": ("TL2 bank transfers: commits/s and abort rate vs workers, clocks, policies",
            _RUN + ["stm_tx"]),
    "delay": ("the price of asynchrony: SGD on weights tau steps stale (a simulation)",
              ["seed", "delay_samples"]),
    "mf": ("Hogwild matrix factorization: seconds per epoch vs workers, RMSE",
           _RUN + ["mf_users", "mf_items", "mf_ratings", "mf_epochs"]),
    "ps": ("parameter server, worker 0 slowed: BSP, ASP, SSP, SaPS; pull+push latency",
           ["reps", "seed"] + _PS + ["ps_seconds", "ps_target", "ps_tight", "ps_loose",
                                     "backend", "quick"]),
    "eager": ("eager-SGD: shm and MPI allreduce speed; sync, solo, majority training",
              ["reps", "seed", "eager_seconds", "eager_target", "eager_sleep", "quick"]),
    "torch_ddp": ("DDP hooks on the reference CNN: eager-SGD solo/majority vs allreduce under "
                  "imbalance; TopK 0.1%% with and without error feedback vs dense",
                  ["reps", "seed", "torch_ddp_ranks", "torch_ddp_data", "torch_ddp_epochs",
                   "torch_ddp_compress_epochs", "torch_ddp_sleep", "torch_ddp_target",
                   "torch_ddp_lr", "torch_ddp_momentum", "torch_ddp_late",
                   "torch_ddp_average", "quick"]),
    "torch_nets": ("Hogwild on a torch CNN: 1 vs 2 workers, threads and processes, blocks, "
                   "beside mnist_hogwild", ["reps", "seed", "quick"]),
    "compress": ("sparsified gradients: top-k selection, what it leaves out, training",
                 ["seed", "compress_reps", "no_mpi", "quick"]),
    "unreliable": ("training over lossy links: RPS against the drop rate and servers",
                   ["reps", "seed"] + _PS + ["unreliable_epochs", "quick"]),
    "nonconvex": ("an MLP: Hogwild, block-partitioned Hogwild, synchronous SGD, the PS",
                  ["reps", "seed", "quick"]),
    "clock": ("the parameter server's version clock: pushes/s, exact vs MultiCounter",
              _RUN + ["clock_seconds", "quick"]),
    "sim": ("simulated at 16-1,024 workers: SaPS, eager-SGD, RPS, TopK; the simulator's speed",
            ["reps", "seed", "sim_parts", "quick"]),
    "schedules": ("a constant step against a cosine one on a torch CNN: held-out accuracy "
                  "of the last model, parameter server and eager-SGD", ["reps", "seed",
                                                                        "quick"]),
}

#: the longer description each scenario's --help shows
DETAILS = {
    "pq-threads": "hold-model throughput vs threads: MultiQueue (nogil loop, bulk API, Python "
                  "level, one queue) beside heapq+Lock and queue.PriorityQueue, then the rank "
                  "error of the kit's configurations just timed",
    "pq-processes": "the hold model across processes sharing one MultiQueue, beside a "
                    "Manager-served queue.PriorityQueue",
    "quality": "rank error and delay of pops, replayed from per-thread operation logs",
    "counter": "MultiCounter increments vs threads/processes, and read() error",
    "hogwild": "Hogwild SGD epoch time and time to a held-out accuracy vs workers, beside "
               "scikit-learn's SGDClassifier and a locked baseline",
    "mis": "greedy MIS / matching: wasted work vs q, k and n; time vs threads beside "
           "sequential greedy (Numba) and networkx",
    "conflict": "competitive ratios of the ski-rental conflict policies (simulator)",
    "stm": "TL2 bank transfers: commits/s and abort rate vs workers, global vs MultiCounter "
           "clock, each conflict policy, threads and processes",
    "delay": "the price of asynchrony: SGD on weights tau steps stale (max or uniform delay), "
             "with momentum, log and squared loss (a deterministic simulation)",
    "mf": "Hogwild matrix factorization: seconds per epoch vs workers, threads and processes, "
          "train and test RMSE",
    "ps": "parameter server, worker 0 slowed 4x: BSP, ASP, SSP, SaPS time to a target loss, "
          "final loss, detections; pull+push latency and pushes/s (--backend shm|ray|both: "
          "shared memory, Ray, or both side by side)",
    "eager": "eager-SGD: shm and MPI allreduce against memcpy and MPI_Allreduce, round "
             "latency; sync, solo and majority allreduce training under the paper's "
             "load-imbalance model (shm, and MPI when mpi4py is installed)",
    "torch_ddp": "sgd_shm.torch.hooks in P processes of an unchanged DDP loop (gloo) on "
                 "DigitsCNN: DDP's allreduce against the solo and majority partial-allreduce "
                 "hooks under the eager-SGD paper's imbalance model (one rank per step sleeps), "
                 "time to a held-out accuracy and final held-out accuracy; TopK 0.1% of each "
                 "bucket with and without error feedback against dense DDP after the same "
                 "epochs",
    "torch_nets": "HogwildNetClassifier on DigitsCNN and 50,000 augmented digits: 1 and 2 "
                  "workers (threads, processes), block partitioning on and off, beside a "
                  "loop written as PyTorch's mnist_hogwild example writes it (1 and 2 "
                  "processes): samples/s and held-out accuracy, the same epochs in all",
    "compress": "sparsified gradients: top-k selection against np.argpartition, what top-k "
                "leaves out, 10 epochs of the parameter server and the eager trainer, dense "
                "against TopK (k/n 0.01%..10%, with and without error feedback), QSGD and "
                "DGC's threshold: loss, bytes, time",
    "unreliable": "training over lossy links: RPS (Yu et al., ICML 2019) final loss against "
                  "the drop rate p and 1..16 servers, beside ASP with the same losses",
    "nonconvex": "an MLP on digits and a generated non-linear problem: Hogwild, block-"
                 "partitioned Hogwild (arXiv:1905.11845) and synchronous SGD, momentum 0 and "
                 "0.9, 1 and 2 workers, the parameter server, beside MLPClassifier",
    "clock": "the parameter server's version clock under contention: processes pushing "
             "tiny fixed gradients to one 8-weight store as fast as they can, exact clock "
             "against MultiCounter clock, pushes/s side by side, and the clock's own cost",
    "sim": "the cluster-scale claims in virtual time (sgd_shm.sim): SaPS against BSP/ASP/SSP "
           "at 32 and 128 workers of a heterogeneous cluster, solo/majority against sync at 64 "
           "ranks under imbalance, RPS's loss gap against the servers at 64 workers, TopK "
           "against dense at 1/10/100 Gb/s, and the simulator's wall time at 1,024 workers",
    "schedules": "step-size schedules near a network's stable edge: DigitsCNN at step 0.1, "
                 "constant against Cosine down to 0.001, on the parameter server (ASP) and "
                 "the eager trainer (sync, solo, majority with momentum 0.9), 2 workers; "
                 "the last model's held-out accuracy and the final training loss per seed "
                 "(--reps seeds)",
}
#: every scenario's results: bench/results/<scenario>.json, in this order under ``all``
ORDER = list(SCENARIOS) + ["plot"]


def _add(ap, names, quick_help=None):
    """The options ``names`` (keys of FLAGS) on the parser ``ap``."""
    for name in names:
        flag, kw = FLAGS[name]
        if name == "quick" and quick_help:
            kw = {**kw, "help": quick_help}
        if kw.get("type") in (int, float) and "metavar" not in kw:
            kw = {**kw, "metavar": "N" if kw["type"] is int else "X"}
        ap.add_argument(flag, **kw)


def build_parser():
    """(the ``python -m bench`` parser, {scenario: its subparser}): one subcommand per
    scenario with its own options, ``all`` with every option, ``plot``."""
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="scenario", metavar="SCENARIO", title="scenarios",
                            required=True)
    subs = {}
    for name, (summary, names) in SCENARIOS.items():
        sp = sub.add_parser(name, help=summary, description=f"{DETAILS[name]}. Writes "
                            f"bench/results/{name}.json (or in --out).")
        _add(sp, names + ["out", "label"], name in QUICK and f"a short run: {QUICK[name]}")
        subs[name] = sp
    every = list(dict.fromkeys(n for _, names in SCENARIOS.values() for n in names))
    sp = sub.add_parser("all", help="every scenario above, then plot (takes every option)",
                        description="Every scenario in turn, then plot; each option applies "
                                    "to the scenarios that take it.")
    _add(sp, every + ["out", "label"],
         "; ".join(f"{k}: {v}" for k, v in QUICK.items()))
    subs["all"] = sp
    sp = sub.add_parser("plot", help="PNG plots and docs/benchmarks.md from the JSON results",
                        description="PNG plots and docs/benchmarks.md (tables, plots) from the "
                                    "JSON results (with --out: the page beside them).")
    _add(sp, ["out"])
    subs["plot"] = sp
    subs["mq-harness"] = _mq_harness_parser(sub)
    return ap, subs


def _mq_harness_parser(sub):
    """``mq-harness``: not part of ``all`` (it needs two checkouts of C++ code)."""
    from bench import mq_harness
    sp = sub.add_parser("mq-harness", help="the kit's MultiQueue in the C++ MultiQueue's own "
                        "benchmark harness (needs checkouts of both; not part of all)",
                        description=mq_harness.__doc__,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    sp.add_argument("--harness", required=True, metavar="EXP",
                    help="a checkout of multiqueue_experiments")
    sp.add_argument("--mq-lib", required=True, metavar="MQ",
                    help="a checkout of the multiqueue library (branch master)")
    sp.add_argument("--build-dir", default="/tmp/mq-harness-build",
                    help="where the two binaries are built (kept; default %(default)s)")
    sp.add_argument("--prefill-total", type=int, default=1 << 20, metavar="N",
                    help="keys prefilled in all (default 2^20)")
    sp.add_argument("--iters-total", type=int, default=1 << 21, metavar="N",
                    help="pop+push iterations in all (default 2^21)")
    _add(sp, ["workers", "reps", "seed", "out", "label"])
    return sp


def cmd_mq_harness(args):
    from bench import mq_harness
    common.print_header(common.header(args))
    mq_harness.main_cli(args, common)


_POSITIVE_INTS = ("reps", "prefill", "iters", "py_iters", "manager_iters", "quality_iters",
                  "epochs", "sgd_samples", "sgd_features", "mis_n", "mis_m", "mis_degree",
                  "waste_seeds", "nx_n", "stm_tx", "ps_workers", "ps_samples", "ps_features",
                  "mf_users", "mf_items", "mf_ratings", "mf_epochs", "torch_batch",
                  "delay_samples", "compress_reps", "unreliable_epochs", "stickiness",
                  "torch_ddp_ranks", "torch_ddp_epochs", "torch_ddp_compress_epochs",
                  "prefill_total", "iters_total")
_POSITIVE = ("clock_seconds", "ps_seconds", "ps_target", "ps_tight", "ps_loose", "eager_seconds",
             "eager_target", "eager_sleep", "torch_ddp_target", "torch_ddp_lr")


def check(ap, args):
    """The options' rules (``ap.error``: exit status 2 naming the option and the fix)."""
    for name in _POSITIVE_INTS:
        if getattr(args, name, 1) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    for name in _POSITIVE:
        if not getattr(args, name, 1) > 0:
            ap.error(f"--{name.replace('_', '-')} must be > 0")
    if getattr(args, "workers", None):
        try:
            common.parse_counts(args.workers)
        except ValueError as e:
            ap.error(f"--workers: {e}")
    if getattr(args, "backend", "shm") != "shm" and importlib.util.find_spec("ray") is None:
        ap.error(f"--backend {args.backend} needs Ray: pip install 'relaxed-sgd-kit[ray]'")
    if getattr(args, "cxx_mq", None) is not None and not (
            os.path.isfile(args.cxx_mq) and os.access(args.cxx_mq, os.X_OK)):
        ap.error(f"--cxx-mq {args.cxx_mq!r} is not an executable file; build it from "
                 "bench/cxx/mq_hold.cpp (the build lines are at its top)")
    bad = set(getattr(args, "mis_parts", "").split(",")) - {"waste", "multiqueue",
                                                            "networkx", ""}
    if bad:
        ap.error(f"--mis-parts: unknown part(s) {sorted(bad)}; use waste, multiqueue, networkx")
    if getattr(args, "pbbs", None) is not None:
        from bench import mis
        if not mis.pbbs_binaries(args.pbbs):
            ap.error(f"--pbbs {args.pbbs!r}: no built binary found; build e.g. "
                     f"{mis.PBBS_BINARIES[('MIS', 'PBBS incrementalMIS')]} (make in its folder)")
    if args.out:
        out_dir(ap, args.out)
        common.set_results_dir(args.out)
    try:
        common.set_label(getattr(args, "label", None))
    except ValueError as e:
        ap.error(f"--{e}")
    return args


STEPS = {"pq-threads": lambda a: cmd_pq(a, "threads"),
         "pq-processes": lambda a: cmd_pq(a, "processes"),
         "quality": cmd_quality, "counter": cmd_counter, "hogwild": cmd_hogwild, "mis": cmd_mis,
         "conflict": cmd_conflict, "stm": cmd_stm, "delay": cmd_delay, "mf": cmd_mf,
         "ps": cmd_ps, "eager": cmd_eager, "torch_ddp": cmd_torch_ddp,
         "torch_nets": cmd_torch_nets,
         "compress": cmd_compress,
         "unreliable": cmd_unreliable, "nonconvex": cmd_nonconvex, "clock": cmd_clock,
         "sim": cmd_sim, "schedules": cmd_schedules,
         "plot": cmd_plot, "mq-harness": cmd_mq_harness}


def main(argv=None):
    """``python -m bench SCENARIO [options]`` (``python -m bench SCENARIO --help``)."""
    ap, subs = build_parser()
    args = ap.parse_args(argv)
    check(subs[args.scenario], args)
    t0 = time.time()
    if args.scenario not in ORDER and args.scenario != "all":     # (mq-harness)
        STEPS[args.scenario](args)
    for name in ORDER:
        if args.scenario in (name, "all"):
            t1 = time.time()
            STEPS[name](args)
            if args.scenario == "all":
                print(f"({name} done in {time.time() - t1:.1f} s)", file=sys.stderr)
    print(f"\n(done in {time.time() - t0:.0f} s)", file=sys.stderr)


if __name__ == "__main__":
    main()
