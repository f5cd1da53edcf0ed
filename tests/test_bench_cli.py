"""The benchmark command runs end to end on tiny settings and writes JSON and PNGs.
(No assertion on speed: speed is measured by ``python -m bench``, not by tests.)"""
import importlib.util
import json
import os
import subprocess
import statistics
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_bench_all_tiny(tmp_path):
    """Every scenario (the parameter server's on shared memory: Ray's side is
    test_bench_ps_on_ray_alone's), the plots and the page; the held-out reports of
    compress, unreliable and nonconvex (their --quick runs are this run's)."""
    r = subprocess.run([sys.executable, "-m", "bench", "all", "--workers", "1,2", "--reps", "1",
                        "--prefill", "2000", "--iters", "2000", "--py-iters", "500",
                        "--manager-iters", "20", "--quality-iters", "1000",
                        "--sgd-samples", "3000", "--sgd-features", "500", "--epochs", "2",
                        "--mis-n", "3000", "--mis-m", "15000", "--waste-sizes", "500,2000",
                        "--waste-seeds", "2", "--nx-n", "500", "--quick", "--stm-tx", "300",
                        "--ps-workers", "2", "--ps-samples", "2000", "--ps-features", "200",
                        "--ps-seconds", "0.6", "--ps-target", "0.69",
                        "--mf-users", "300", "--mf-items", "100", "--mf-ratings", "5000",
                        "--mf-epochs", "2", "--delay-samples", "2000",
                        "--backend", "shm",
                        "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                       timeout=1500)                  # a hang guard: every scenario, quick
    assert r.returncode == 0, r.stderr
    stdout = r.stdout
    torch = importlib.util.find_spec("torch") is not None
    for name in ("pq-threads", "pq-processes", "quality", "counter", "hogwild", "mis",
                 "conflict", "stm", "delay", "mf", "ps", "eager", "compress", "unreliable",
                 "nonconvex", "clock", "sim") + (("torch_ddp", "torch_nets", "schedules")
                                                  if torch else ()):
        data = json.loads((tmp_path / f"{name}.json").read_text())
        assert data["header"]["cpu_count"] == os.cpu_count()
        assert data["results"], name
    _check_queues(tmp_path)
    _check_hogwild(json.loads((tmp_path / "hogwild.json").read_text()))
    _check_mis_stm(tmp_path)
    _check_ps(json.loads((tmp_path / "ps.json").read_text()), stdout, ("shm",))
    _check_mf_delay(tmp_path)
    _check_nonconvex(json.loads((tmp_path / "nonconvex.json").read_text()), stdout)
    _check_compress(json.loads((tmp_path / "compress.json").read_text()), stdout)
    _check_unreliable(json.loads((tmp_path / "unreliable.json").read_text()), stdout)
    ck = json.loads((tmp_path / "clock.json").read_text())
    assert {(r["workload"], r["processes"], r["clock"]) for r in ck["results"]} == {
        (w, p, c) for w in ("push", "clock") for p in (1, 2) for c in ("exact", "multicounter")}
    assert all(r["median"] > 0 for r in ck["results"]) and len(ck["ratios"]) == 4
    if torch:
        _check_torch_nets(json.loads((tmp_path / "torch_nets.json").read_text()))
        _check_schedules(json.loads((tmp_path / "schedules.json").read_text()))
    _check_page(tmp_path, torch)


def _check_queues(tmp_path):
    """``bench quality`` and ``pq-threads``: one queue is exact, every MultiQueue
    competitor reports its rank error at each thread count."""
    q = json.loads((tmp_path / "quality.json").read_text())["results"]
    bad = [row for row in q if row["queues"] == 1 and row["rank_max"] != 0]
    assert not bad, bad
    pq = json.loads((tmp_path / "pq-threads.json").read_text())["results"]
    ranked = {(r["competitor"], r["workers"]): r for r in pq if "rank_error_mean" in r}
    assert set(ranked) == {(c, w) for c in ("mq-nogil", "mq1-nogil", "mq-sticky") for w in (1, 2)}
    assert ranked["mq1-nogil", 2]["rank_error_mean"] == 0      # one queue is exact


def _check_hogwild(hw):
    """``bench hogwild``: every competitor, paired speed-ups within their ranges,
    held-out accuracy above chance, the hot-feature sweep's rows."""
    assert {r["competitor"] for r in hw["results"]} == {"sklearn", "hogwild-threads",
                                                        "hogwild-processes", "locked",
                                                        "hogwild-plain"}
    for r in hw["results"]:                  # paired speed-ups: 1 worker against itself is 1
        if r["competitor"] != "sklearn" and r["workers"] == 1:
            assert r["speedup_vs_1"] == 1.0
        elif r["competitor"] != "sklearn":
            lo, hi = r["speedup_vs_1_range"]
            assert lo <= r["speedup_vs_1"] <= hi
    assert all(0.5 < r["final_val_accuracy"] <= 1 for r in hw["results"])   # held out
    assert all(0.5 < f["val_accuracy"] <= 1 for f in hw["fits"] + hw["hot_sweep"])
    assert hw["staleness"]["threads-1"]["frac_tau0"] == 1.0
    assert hw["hot_layout_s"]["hot_s"] > 0 and hw["hot_layout_s"]["plain_s"] > 0
    sweep = hw["hot_sweep"]                 # both problems, each variant, one worker = 1x
    assert [(r["problem"], r["workers"], r["hot_features"]) for r in sweep] == [
        (p, w, h) for p, d in (("default", 500), ("wide", 5000))
        for w, h in ((1, 0), (2, 0), (2, min(4096, d - 1)), (2, d))]
    assert all(r["speedup_vs_1"] == 1.0 for r in sweep if r["workers"] == 1)
    assert sum(r["auto"] for r in sweep) <= 2


def _check_mis_stm(tmp_path):
    """``bench mis`` and ``stm``: every scheduler, algorithm, clock and backend."""
    mis = json.loads((tmp_path / "mis.json").read_text())
    assert {r["scheduler"] for r in mis["waste"]} == {"multiqueue", "k-relaxed"}
    assert {(r["algorithm"], r["threads"]) for r in mis["results"]
            if r["competitor"] == "MultiQueue"} == {("MIS", 1), ("MIS", 2), ("matching", 1),
                                                    ("matching", 2)}
    stm = json.loads((tmp_path / "stm.json").read_text())
    assert {r["clock"] for r in stm["results"]} == {"global", "multicounter"}
    assert {r["backend"] for r in stm["results"]} == {"threads", "processes"}
    assert all(r["ratio"] > 0 for r in stm["ratios"]), stm["ratios"]


def _check_mf_delay(tmp_path):
    """``bench mf`` (every backend beats the mean's RMSE on held-out ratings) and
    ``delay`` (no delay, no excess loss)."""
    mf = json.loads((tmp_path / "mf.json").read_text())
    assert {(r["backend"], r["workers"]) for r in mf["results"]} == {
        ("threads", 1), ("threads", 2), ("processes", 1), ("processes", 2)}
    assert all(r["test_rmse_median"] < mf["problem"]["mean_baseline_test_rmse"] * 1.5
               for r in mf["results"]), ([r["test_rmse_median"] for r in mf["results"]],
                                         mf["problem"]["mean_baseline_test_rmse"])
    dl = json.loads((tmp_path / "delay.json").read_text())["results"]
    assert {(r["loss"], r["mode"]) for r in dl} == {("log", "max"), ("log", "uniform"),
                                                   ("squared", "max"), ("squared", "uniform")}
    assert all(r["excess"] == 0.0 for r in dl if r["tau"] == 0), dl


def _check_page(tmp_path, torch):
    """The page (--out: beside the JSON): a section and a plot per scenario that ran
    (all but mq-harness, and the torch ones only with torch)."""
    page = (tmp_path / "benchmarks.md").read_text()
    assert "| shm | bsp |" in page
    from bench import report
    from bench.__main__ import SCENARIOS as RUN_BY_ALL      # (mq-harness needs checkouts)
    ran = [sc for sc in report.SCENARIOS if (tmp_path / f"{sc.name}.json").exists()]
    in_all = [sc for sc in report.SCENARIOS if sc.name in RUN_BY_ALL]
    assert len(in_all) == len(report.SCENARIOS) - 1          # every one but mq-harness
    assert len(ran) == len(in_all) - (0 if torch else 3)   # torch_*, schedules: the extra
    assert page.count("\n## ") == 1 + len(ran)           # machines + every scenario
    assert page.count("](") >= 11                          # a plot per scenario, linked
    for png in ("pq-threads.png", "pq-processes.png", "counter.png", "quality-rank-cdf.png",
                "hogwild.png", "mis.png", "conflict.png", "stm.png", "mf.png", "ps.png",
                "delay.png", "compress.png", "unreliable.png", "nonconvex.png", "clock.png"):
        assert (tmp_path / png).stat().st_size > 1000


def _check_torch_nets(d):
    """``bench torch_nets``: every competitor (the kit's and the mnist_hogwild-style
    loop) trains above chance (0.1) on held-out digits, and the paired ratios and
    findings are filled in."""
    from bench import torch_nets
    rows = d["results"]
    assert [r["competitor"] for r in rows] == [c[0] for c in torch_nets.COMPETITORS]
    for r in rows:
        assert r["samples_per_s_median"] > 0 and len(r["runs"]) == 1
        assert 0.2 < r["val_score_median"] <= 1.0, r
    assert set(d["ratios"]) == {p[0] for p in torch_nets.PAIRS}
    assert len(d["findings"]) == 6
    assert "mnist_hogwild-2" in torch_nets.summary_markdown(d)


def _check_schedules(d):
    """``bench schedules --quick`` (one epoch: the plumbing, not the claim): every
    trainer at both steps, the cosine run over the constant run's updates (the budget
    its rule gives), a held-out accuracy and a finite loss for a run that did not
    diverge, the paired difference only beside the cosine rows."""
    from bench import schedules
    from sgd_shm.data import load_digits_split
    rows = d["results"]
    assert [(r["trainer"], r["step"]) for r in rows] == [
        (t, s) for t in schedules.TRAINERS for s in schedules.STEPS]
    data = load_digits_split(0.2, random_state=0)
    for r in rows:
        trainer = schedules.TRAINERS[r["trainer"]][0]
        assert r["updates"] == schedules._budget(trainer, data, 1) and len(r["runs"]) == 1
        if r["diverged"] == 0:
            assert 0.0 <= r["val_score_median"] <= 1.0 and np.isfinite(r["final_loss_worst"])
    table = schedules.summary_markdown(d)
    assert "| ps-asp | cosine |" in table and table.count(" pt |") == len(rows) // 2


def _check_ps(ps, stdout, backends):
    """``bench ps --backend``: every policy on every backend; the shared-memory transport
    rows (pull + push latency, pushes/s); dense ASP's pushes/s at 2 workers on every
    backend and, with Ray, Ray's own actor-call rates beside them; the tables printed."""
    assert {(r["backend"], r["policy"]) for r in ps["results"]} == {
        (b, p) for b in backends for p in ("bsp", "asp", "ssp", "saps")}
    assert all(r["runs"] == 1 and r["updates_median"] > 0 for r in ps["results"])
    assert all(0.5 < r["val_score_median"] <= 1 for r in ps["results"])   # held out, scored
    assert ps["problem"]["target_kind"] == "held-out accuracy"
    tr = ps["transport"]                 # shared memory's; Ray's cost is its actor calls
    assert {(t["backend"], t["workers"]) for t in tr} == (
        {("shm", n) for n in (1, 2)} if "shm" in backends else set())
    for t in tr:
        assert 0 < t["pull_us_median"] < t["roundtrip_us_median"]
        assert t["push_us_median"] < t["roundtrip_us_median"] and t["pushes_per_s_median"] > 0
    assert {(r["backend"], r["workers"]) for r in ps["asp_pushes_per_s"]} == {
        (b, 2) for b in backends}
    assert all(r["median"] > 0 for r in ps["asp_pushes_per_s"])
    if "ray" in backends:
        calls = ps["ray_calls"]
        assert calls["sync_calls_per_s_median"] > 0 and calls["pipelined_calls_per_s_median"] > 0
        assert "Ray's own 1:1 actor calls" in stdout
    assert set(ps["curves"]) == set(ps["ratios"]) == set(ps["control_detections"]) == set(
        backends)
    assert ("| shm | 2 |" in stdout) == ("shm" in backends)
    for b in backends:
        assert f"| {b} | saps |" in stdout


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs the ray extra")
def test_bench_ps_on_ray_alone(tmp_path):
    """``bench ps --backend ray``: every policy on Ray, Ray's own actor-call rates beside
    dense ASP's pushes, no shared-memory rows; the page's section and the plot render
    from the JSON."""
    r = subprocess.run([sys.executable, "-m", "bench", "ps", "--quick", "--ps-workers", "2",
                        "--ps-samples", "2000", "--ps-features", "200", "--ps-seconds", "0.6",
                        "--ps-target", "0.69", "--backend", "ray", "--out", str(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    d = json.loads((tmp_path / "ps.json").read_text())
    _check_ps(d, r.stdout, ("ray",))
    from bench import ps
    page = ps.summary_markdown(d)
    assert "| ray | asp |" in page and "on Ray" in page and "actor calls" in page
    assert "| shm |" not in page
    ps.plot(d, str(tmp_path / "ps.png"))
    assert (tmp_path / "ps.png").stat().st_size > 1000


def test_bench_rejects_bad_settings():
    r = subprocess.run([sys.executable, "-m", "bench", "pq-threads", "--workers", "0"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "positive" in r.stderr
    r = subprocess.run([sys.executable, "-m", "bench", "pq-threads", "--reps", "0"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--reps must be >= 1" in r.stderr
    r = subprocess.run([sys.executable, "-m", "bench", "pq-threads", "--label", "../x"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--label must be 1-40 letters" in r.stderr


def test_a_labelled_run_is_kept_beside_the_main_one(tmp_path, monkeypatch):
    """--label NAME writes <scenario>@NAME.json and leaves the main run alone; the
    page lists both machines and shows the kept run's table under the scenario."""
    from bench import common, report
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    monkeypatch.setattr(common, "LABEL", None)

    def run(cpu, n, rate):
        hdr = {"command": "python -m bench pq-threads", "date": "2026-01-01", "cpu": cpu,
               "cpu_count": n, "python": "3.11", "numpy": "2", "reps": 1}
        return hdr, [{"competitor": "mq-nogil", "workers": 1, "min": rate, "median": rate,
                      "max": rate, "rates": [rate]}]
    common.write_json("pq-threads", *run("Main CPU", 2, 5e6))
    common.set_label("box-b")
    common.write_json("pq-threads", *run("Box B CPU", 4, 7e6))
    assert json.loads((tmp_path / "pq-threads.json").read_text())["header"]["cpu"] == "Main CPU"
    assert [(lab, d["header"]["cpu"]) for lab, d in common.labelled_results("pq-threads")] == [
        ("box-b", "Box B CPU")]
    page = report.page(tmp_path)
    assert "| Box B CPU | 4 |" in page and "pq-threads@box-b |" in page
    main, kept = page.split("### The same, kept as `box-b` (Box B CPU, 4 CPUs)")
    assert "| mq-nogil | 5.00 M" in main and "| mq-nogil | 7.00 M" in kept
    for bad in ("", "a/b", "@x", "x" * 41):
        with pytest.raises(ValueError, match="label must be"):
            common.set_label(bad)


def test_demo_consumer_keeps_the_item_found_after_done():
    """``python -m relaxed``'s consumer: a pop that finds the queue empty while the
    producers still push, then done set, then an item: the item is kept (it was
    dropped once, and 'exactly once' failed under load)."""
    import queue
    from relaxed.__main__ import _consume

    class Done:
        flag = False

        def is_set(self):
            return self.flag

    done = Done()

    class Q:
        items = [None, (5, 50), None, None]

        def try_pop(self):
            r = self.items.pop(0)
            if r is None:
                done.flag = True          # the producers end right after this scan
            return r
    out = queue.Queue()
    _consume(Q(), done, out)
    assert out.get().tolist() == [50]


def test_main_jobs_run():
    r = subprocess.run([sys.executable, "-m", "sgd_shm", "hogwild", "--samples", "3000",
                        "--features", "500", "--epochs", "2"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "Hogwild, 2 processes" in r.stdout and "tau" in r.stdout
    r = subprocess.run([sys.executable, "-m", "relaxed", "--items", "2000"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "exactly once: True" in r.stdout
    assert "equals sequential greedy: False" not in r.stdout
    assert r.stdout.count("equals sequential greedy: True") == 6   # 3 schedulers x 1, 2 threads
    assert "saw another total: 0 of" in r.stdout
    r = subprocess.run([sys.executable, "-m", "sgd_shm", "hogwild", "--epochs", "0"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--epochs must be >= 1" in r.stderr
    from relaxed.__main__ import main as relaxed_main
    with pytest.raises(SystemExit) as e:                   # (numpy's words before)
        relaxed_main(["--seed", "-1"])
    assert e.value.code == 2


def test_parameter_server_cli(tmp_path):
    """The main job: ``python -m sgd_shm`` is the parameter server."""
    r = subprocess.run([sys.executable, "-m", "sgd_shm", "--workers", "2", "--seconds", "0.8",
                        "--samples", "3000", "--features", "300", "--target", "0.65",
                        "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    for pol in ("bsp", "asp", "ssp", "saps"):
        assert pol in r.stdout
    data = json.loads((tmp_path / "ps-main.json").read_text())
    assert set(data["results"]) == {"bsp", "asp", "ssp", "saps"}
    for res in data["results"].values():
        assert res["batches"]["lost"] == 0 and sum(map(sum, res["staleness_hist"])) > 0
    assert "mean tau" in r.stdout and "stolen" in r.stdout and "held-out acc" in r.stdout
    assert all(res["val_score"] > 0.65 for res in data["results"].values())
    assert (tmp_path / "ps-main.png").stat().st_size > 1000
    r = subprocess.run([sys.executable, "-m", "sgd_shm.ps", "--policies", "gossip"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "unknown" in r.stderr
    r = subprocess.run([sys.executable, "-m", "sgd_shm", "--address", "ray://head:10001"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--backend ray" in r.stderr


def test_torch_reference_trains():
    """The optional PyTorch Hogwild reference of ``bench hogwild --torch`` (skipped where
    torch is not installed: it is not a dependency of the kit)."""
    pytest.importorskip("torch")
    from bench.torch_hogwild import epoch_seconds
    from sgd_shm.data import make_rcv1_like
    X, y = make_rcv1_like(3000, 300, random_state=0)
    for workers in (1, 2):
        t, loss = epoch_seconds(X, y, workers, epochs=2)
        assert t > 0 and loss < 0.69


def test_cxx_reference_equals_the_kit_on_one_worker(tmp_path):
    """The C++ Hogwild reference of ``bench hogwild --cxx`` runs the kit's algorithm: on
    one worker, given the kit's orders of the samples, it reaches the kit's weights epoch
    by epoch (to rounding: the two sum in different orders); with its own shuffle, the
    kit's training loss within 0.03 (the first, large steps depend on the order).
    Skipped where no C++ compiler is installed. Then 2 workers, and the CLI path."""
    from bench import cxx_hogwild
    if cxx_hogwild.compiler() is None:
        pytest.skip("no C++ compiler")
    from bench.hogwild import train_loss
    from naive import record_orders
    from sgd_shm.hogwild import _kernels as K
    from sgd_shm.data import make_rcv1_like
    from sgd_shm.hogwild import HogwildSGD, Problem
    X, y = make_rcv1_like(3000, 300, random_state=0)
    ref = cxx_hogwild.Reference(X, y)
    try:
        sgd = HogwildSGD(300, 1, loss="log_loss", alpha=1e-4, intercept_decay=0.01, seed=0)
        prob = Problem.from_xy(X, y[:, None])
        ours, orders = [], record_orders(sgd)
        for e in range(3):
            sgd.epoch(prob)
            ours.append((sgd.W[0].copy(), sgd.b[0]))
        _, same = ref.run(1, 3, 0, 1e-4, K.optimal_t0(1e-4, K.LOG), orders=np.stack(orders))
        times, own = ref.run(1, 3, 0, 1e-4, K.optimal_t0(1e-4, K.LOG))
        assert len(times) == 3 and min(times) > 0
        for e in range(3):
            np.testing.assert_allclose(same[e][0], ours[e][0], rtol=1e-7, atol=1e-9)
            assert abs(same[e][1] - ours[e][1]) < 1e-7
            loss = train_loss(X, y, *ours[e])
            assert abs(train_loss(X, y, *own[e]) - loss) < 0.03, (e, loss)
        assert ref.run(2, 2, 1, 1e-4, K.optimal_t0(1e-4, K.LOG))[0][1] > 0
    finally:
        ref.close()
    assert not ref.dir.exists()
    r = subprocess.run([sys.executable, "-m", "bench", "hogwild", "--cxx", "--reps", "1",
                        "--sgd-samples", "2000", "--sgd-features", "200", "--epochs", "2",
                        "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    rows = json.loads((tmp_path / "hogwild.json").read_text())["results"]
    cx = {r["workers"]: r for r in rows if r["competitor"] == "cxx-hogwild"}
    assert set(cx) == {1, 2} and cx[2]["final_train_loss"] < 0.69


@pytest.mark.parametrize("squared", [False, True])
@pytest.mark.parametrize("tau, mu", [(0, 0.0), (3, 0.0), (5, 0.9)])
def test_delay_simulator_equals_the_naive_loop(tau, mu, squared):
    """bench delay's Numba simulator (max delay) against a plain Python loop that
    keeps every past weight vector (tests/naive.py): the same final loss."""
    import numpy as np

    from bench.delay import delayed_sgd, delayed_weights, problem
    from naive import delayed_sgd_naive
    X, y = problem(300, 4, 0)
    if squared:
        y = X @ np.arange(1.0, 5.0)
    order = np.random.default_rng(1).permutation(300)
    w = delayed_sgd_naive(X, y, order, 2, 0.01, 1e-3, tau, mu, squared)
    if squared:
        ref = np.mean(0.5 * (X @ w - y) ** 2)
    else:
        ref = np.mean(np.logaddexp(0.0, -y * (X @ w)))
    ref += 0.5e-3 * (w @ w)
    got = delayed_sgd(X, y, order.astype(np.int64), 2, 0.01, 1e-3, tau, False, mu, 0, squared)
    assert abs(got - ref) <= 1e-12 * max(1.0, abs(ref))
    wts = delayed_weights(X, y, order.astype(np.int64), 2, 0.01, 1e-3, tau, False, mu, 0,
                          squared)
    np.testing.assert_allclose(wts, w, rtol=1e-12, atol=1e-14)


def test_cxx_mq_option_runs_the_binary_interleaved(tmp_path):
    """--cxx-mq PATH: the binary gets (threads, prefill, iters, queues per thread, seed,
    stickiness) once per repetition and worker count, its default policy (stickiness 0)
    and its sticky one at --stickiness, and its ops_per_s is what the JSON records; the
    kit's hold-loop rows carry the rank error of their configuration."""
    fake = tmp_path / "mq_hold"
    calls = tmp_path / "calls.txt"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n'
                    'echo "{\\"threads\\": $1, \\"ops_per_s\\": $(( $1 * 1000 + $6 * 100 + $5 ))}"\n')
    fake.chmod(0o755)
    cmd = [sys.executable, "-m", "bench", "pq-threads", "--only", "mq-nogil,mq-sticky",
           "--workers", "1,2", "--reps", "2", "--prefill", "2000", "--iters", "3000",
           "--quality-iters", "500", "--stickiness", "4", "--out", str(tmp_path)]
    r = subprocess.run(cmd + ["--cxx-mq", str(fake)], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    rows = json.loads((tmp_path / "pq-threads.json").read_text())["results"]
    assert {row["competitor"] for row in rows} == {"mq-nogil", "mq-sticky", "cxx-mq",
                                                   "cxx-mq-sticky"}
    cxx = {(row["competitor"], row["workers"]): row for row in rows
           if row["competitor"].startswith("cxx")}
    assert cxx["cxx-mq", 1]["rates"] == [1001.0, 1002.0]
    assert cxx["cxx-mq", 2]["rates"] == [2001.0, 2002.0]
    assert cxx["cxx-mq-sticky", 2]["rates"] == [2401.0, 2402.0]
    assert calls.read_text().split("\n")[:4] == ["1 2000 3000 2 0 0", "1 2000 3000 2 0 4",
                                                 "1 2000 3000 2 1 0", "1 2000 3000 2 1 4"]
    kit = {(row["competitor"], row["workers"]): row for row in rows
           if row["competitor"].startswith("mq")}
    assert kit["mq-sticky", 2]["stickiness"] == 4 and kit["mq-nogil", 2]["stickiness"] == 1
    assert kit["mq-nogil", 2]["queues"] == 4 and len(kit["mq-nogil", 2]["rank_error_runs"]) == 5
    # two queues and one thread: the two choices are both queues, so every pop is exact
    assert kit["mq-nogil", 1]["rank_error_mean"] == 0 == kit["mq-sticky", 1]["rank_error_mean"]
    assert kit["mq-sticky", 2]["rank_error_mean"] >= 0
    bad = subprocess.run(cmd + ["--cxx-mq", str(tmp_path / "missing")], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "not an executable file" in bad.stderr


def _quick(tmp_path, scenario, *extra):
    """``python -m bench <scenario> --quick`` (or ``extra`` options) into tmp_path;
    the JSON it wrote."""
    r = subprocess.run([sys.executable, "-m", "bench", scenario, *(extra or ("--quick",)),
                        "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    return json.loads((tmp_path / f"{scenario}.json").read_text()), r.stdout


def _check_compress(cp, out):
    """bench compress --quick: every training run carries its final held-out accuracy
    and a held-out history; dense is its own reference (gap 0, target reached);
    error feedback is compared per ratio; the page's tables and findings say so.
    Dense reaches >= 0.9 held-out accuracy on the small problem in 2 epochs (0.935
    seen)."""
    sel = {r["competitor"] for r in cp["results"] if r["part"] == "selection"}
    assert {"kit TopK.compress", "np.argpartition"} <= sel
    assert set(cp["claims"]) >= {"small/ps", "small/eager"}
    assert all(c["bytes_ratio"] > 100 for c in cp["claims"].values()), cp["claims"]  # 667x
    assert all(0.5 < r["val_score"] <= 1 for r in cp["results"] if r["part"] == "training")
    assert cp["curve"]["curves"] and cp["curve"]["bound"][-1] == 0.0
    runs = [r for r in cp["results"] if r["part"] == "training"]
    assert {(r["trainer"], r["config"]) for r in runs} >= {
        ("ps", "dense"), ("ps", "topk 0.001 ef"), ("ps", "topk 0.001 no-ef"),
        ("eager", "dense"), ("eager", "topk 0.001 no-ef")}
    for r in runs:
        assert 0.5 < r["val_score"] <= 1 and all(len(h) == 4 for h in r["history"]), r
    for key, s in cp["summary"].items():
        dense = s["configs"]["dense"]
        assert dense["acc_gap"] == 0.0 and dense["time_to_target"] is not None, key
        assert dense["val_score"] >= 0.9, (key, dense["val_score"])
    assert set(cp["feedback"]) >= {"small/ps", "small/eager"}
    for res in cp["feedback"].values():
        assert set(res) == {"0.001", "0.01"}
        assert all(f["seeds"] == 1 and f["measurable"] is None for f in res.values())
    assert "held-out acc" in out and "Error feedback" in out and "Findings" in out
    assert all(c["acc_gap_range"][0] <= c["acc_gap"] <= c["acc_gap_range"][1]
               for c in cp["claims"].values())


def _check_unreliable(un, out):
    """bench unreliable --quick: every row carries the final held-out accuracies and
    their gaps to p = 0 of the same seed (0 at p = 0); the curves carry held-out
    accuracy; the findings state held-out gaps."""
    assert {r["series"] for r in un["results"]} == {"shards", "coupled", "asp"}
    assert all(r["gap"] == [0.0] == r["val_gap"] for r in un["results"] if r["drop"] == 0.0), \
        [r for r in un["results"] if r["drop"] == 0.0]
    for r in un["results"]:
        assert all(0.5 < a <= 1 for a in r["val_score"]), r
        base = next(b for b in un["results"] if (b["series"], b["shards"], b["drop"]) ==
                    (r["series"], r["shards"], 0.0))
        assert r["val_gap"] == [a - b for a, b in zip(r["val_score"], base["val_score"])]
    assert all(len(c["val_score"]) == len(c["epochs"]) for c in un["curves"].values())
    assert any("held-out accuracy drop" in f for f in un["findings"]), un["findings"]
    assert "held-out acc at p = 0" in out


def test_bench_delay_reports_held_out_accuracy(tmp_path):
    """bench delay: the log-loss rows carry the held-out accuracy of the final weights,
    the squared-loss rows the held-out loss; both against tau = 0 (0 there); the held-out
    accuracy is that of the naive loop's weights (tests/naive.py) on the held-out rows."""
    from bench.delay import _data
    from naive import delayed_sgd_naive
    dl, out = _quick(tmp_path, "delay", "--delay-samples", "2000")
    p = dl["problem"]
    for r in dl["results"]:
        if r["diverged"]:
            continue
        assert (r["val_score"] is None) == (r["loss"] == "squared"), r
        if r["tau"] == 0:
            assert r["val_loss_excess"] == 0.0 and r["val_score_gap"] in (0.0, None), r
    X, y, Xv, yv = _data(0, p["n"], p["d"], p["holdout"])["log"]
    order = np.random.default_rng(0).permutation(p["n"])
    w = delayed_sgd_naive(X, y, order, p["epochs"], p["lr"], p["alpha"], 4, 0.0, False)
    row = next(r for r in dl["results"] if (r["loss"], r["mode"], r["momentum"], r["tau"]) ==
               ("log", "max", 0.0, 4))
    assert row["val_score"] == float(np.mean(np.sign(Xv @ w) == yv))
    assert "held-out rows" in out and "Findings" in out


def _check_nonconvex(nc, out):
    """bench nonconvex --quick: every row carries its final held-out accuracy and its
    gap to MLPClassifier, paired by seed (0 for MLPClassifier itself); the whole fits
    of the scaling part carry held-out accuracy; the findings state each trainer
    against MLPClassifier as time to a held-out accuracy and the final gap."""
    assert {(r["competitor"], r["workers"]) for r in nc["results"]} >= {
        ("sklearn", 1), ("hogwild", 2), ("blocks", 2), ("sync", 2), ("ps-asp", 2)}
    assert all(0 < r["final_accuracy"] <= 1 for r in nc["results"]), \
        [(r["competitor"], r["final_accuracy"]) for r in nc["results"]]
    sc = nc["scaling"]                                   # 1 worker vs 2 threads / processes
    assert {(r["workers"], r["backend"]) for r in sc["rows"]} == {
        (1, "threads"), (2, "threads"), (2, "processes")}
    assert all(r["speedup_vs_1"] == 1.0 for r in sc["rows"] if r["workers"] == 1)
    assert len(sc["handoff_ns"]) == sc["reps"] == len(sc["placements"])
    assert "handoff_ns_at_start" in nc["header"]
    for r in nc["results"]:
        assert 0 < r["final_accuracy"] <= 1 and "gap_to_sklearn" in r, r
        if r["competitor"] == "sklearn":
            assert r["gap_to_sklearn"] == 0.0
    assert all((r["val_accuracy"] is None) == (r["kind"] == "epoch")
               for r in nc["scaling"]["rows"])
    assert any("to held-out accuracy" in f and "MLPClassifier" in f for f in nc["findings"])
    assert "vs MLPClassifier, points" in out


def test_mq_harness_refuses_missing_checkouts(tmp_path):
    """python -m bench mq-harness needs checkouts of the C++ harness and library: a
    wrong path is named, with what it should hold."""
    from bench import mq_harness
    with pytest.raises(ValueError, match="--harness .*no benchmarks/monotonic.cpp"):
        mq_harness.build(tmp_path, tmp_path, tmp_path / "b")
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "monotonic.cpp").write_text("")
    with pytest.raises(ValueError, match="--mq-lib .*modes/random.hpp"):
        mq_harness.build(tmp_path, tmp_path, tmp_path / "b")


def test_mq_harness_table_quartiles_and_rounds():
    """The benchmarks page's mq-harness table: each paired ratio's median and quartiles
    (the exclusive method, worked out by hand below), its rounds listed up to MAX_LISTED
    and counted beyond."""
    from bench import mq_harness

    def doc(per):
        return {"results": [{"competitor": "kit-harness", "workers": 1, "median": 1e6,
                             "min": 1e6, "max": 1e6}],
                "ratios": [{"ratio": "kit 2 threads / 1", "workers": 2,
                            "median": statistics.median(per), "per_round": per}],
                "header": {"reps": len(per), "cpu": "x", "cpu_count": 2, "command": "c"},
                "prefill_total": 16, "iters_total": 32, "queues_per_thread": 2}
    short = [1.0, 2.0, 3.0, 4.0, 5.0]
    row = next(l for l in mq_harness.summary_markdown(doc(short)).splitlines()
               if l.startswith("| kit 2 threads / 1"))
    # exclusive quartiles of 1..5: positions (n + 1) / 4 = 1.5 and 4.5
    assert row == "| kit 2 threads / 1 | 3.00x | 1.50–4.50 | 1.00 2.00 3.00 4.00 5.00 |"
    long = [float(x) for x in range(mq_harness.MAX_LISTED + 1)]
    row = next(l for l in mq_harness.summary_markdown(doc(long)).splitlines()
               if l.startswith("| kit 2 threads / 1"))
    assert f"| {len(long)} (each in the JSON) |" in row
