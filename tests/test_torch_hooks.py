"""sgd_shm.torch.hooks: DDP communication hooks in real multi-process DDP runs (gloo,
2-3 ranks on this box, see tests/torch_ddp_workers.py), each checked against an
independent reference: plain DDP (no hook) for the dense cases, the per-step identity
of error feedback and its running sums, and tests/naive.py's partial-allreduce oracle
over exactly the contributors each round reports."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from naive import (ddp_mean_naive, error_feedback_naive, momentum_correction_naive,
                   partial_allreduce_naive)
from torch_ddp_workers import contributions, launch

from sgd_shm.collectives import CollectiveError
from sgd_shm.compress import TopK
from sgd_shm.torch import hooks

#: several buckets: DDP puts the test network's 1,765 weights in two after its rebuild
CAP = 0.002


def _ok(out, size):
    assert sorted(out) == list(range(size)), f"ranks missing: {out}"
    for r, res in out.items():
        assert res[0] == "ok", f"rank {r}: {res}"
    return [out[r][1] for r in range(size)]


def _plain(size, steps, **cfg):
    return _ok(launch(size, dict(steps=steps, bucket_cap_mb=CAP, **cfg)), size)


# ---- dense cases equal DDP's allreduce --------------------------------------------------
@pytest.mark.parametrize("hook,extra", [("compress", {"compress": "topk:1.0"}),
                                        ("compress", {"compress": "dense"}),
                                        ("sync", {})])
def test_dense_hooks_equal_plain_ddp_bit_for_bit(hook, extra, no_shm_leak):
    """TopK at ratio 1 (every entry), Dense, and the partial hook's "sync" kind give
    the weights of DDP without a hook, bit for bit, after several steps (2 ranks: a
    sum of two terms does not depend on the order gloo adds them in)."""
    steps = 6
    base = _plain(2, steps)
    got = _ok(launch(2, dict(steps=steps, bucket_cap_mb=CAP, hook=hook, **extra)), 2)
    for r in range(2):
        assert [b for _, b, _ in got[r]["sizes"]].count(1) >= steps - 2, got[r]["sizes"]
        assert np.array_equal(got[r]["w"], base[r]["w"]), (
            f"rank {r}: max diff {np.abs(got[r]['w'] - base[r]['w']).max()}")
    assert np.array_equal(got[0]["w"], got[1]["w"])


def test_topk_ratio_one_three_ranks_matches_to_rounding():
    """At 3 ranks gloo's ring adds the three terms in its own order per chunk, the hook
    in rank order: the weights agree to float32 rounding, the replicas exactly."""
    base = _plain(3, 5)
    got = _ok(launch(3, dict(steps=5, bucket_cap_mb=CAP, hook="compress",
                             compress="topk:1.0")), 3)
    for r in range(3):
        np.testing.assert_allclose(got[r]["w"], base[r]["w"], rtol=1e-5, atol=1e-6)
        assert np.array_equal(got[r]["w"], got[0]["w"])


# ---- compression: error feedback and the mean --------------------------------------------
@pytest.mark.parametrize("spec", ["topk:0.05", "randomk:0.05", "threshold:0.05"])
def test_error_feedback_conserves_mass(spec):
    """Per rank and bucket: each step, sent + new residual = old residual + gradient
    exactly (the entries sent and the ones kept are disjoint); over the run, the sum
    of what was sent plus the last residual = the sum of the gradients (to float32
    rounding of the running sums). The result of every step is the mean over ranks of
    the messages sent, and the hook's memory ends at the logged residual."""
    size, steps = 2, 8
    res = _ok(launch(size, dict(steps=steps, bucket_cap_mb=CAP, hook="compress",
                                compress=spec)), size)
    for k in range(size):
        log = res[k]["log"]
        buckets = sorted({e["bucket"] for e in log})
        assert len(buckets) == 2 and len(log) == 2 * (steps - 2)
        for b in buckets:
            ent = [e for e in log if e["bucket"] == b]
            sent, acc = error_feedback_naive([e["input"] for e in ent],
                                                    [e["sent"] for e in ent])
            for t, e in enumerate(ent):
                assert np.array_equal(e["sent"] + e["residual"], acc[t]), (k, b, t)
                assert np.count_nonzero(e["sent"]) <= max(1, round(0.05 * e["sent"].size)) \
                    or spec.startswith("threshold")
            total_in = np.sum([np.asarray(e["input"], np.float64) for e in ent], axis=0)
            np.testing.assert_allclose(sent + ent[-1]["residual"], total_in,
                                       rtol=1e-5, atol=1e-6)
            assert np.array_equal(res[k]["residuals"][b], ent[-1]["residual"])
    for t in range(len(res[0]["log"])):
        want = ddp_mean_naive([res[k]["log"][t]["sent"] for k in range(size)])
        for k in range(size):
            np.testing.assert_allclose(res[k]["log"][t]["output"], want, rtol=1e-6,
                                       atol=1e-9)
    assert np.array_equal(res[0]["w"], res[1]["w"])


def test_momentum_correction_velocity_and_mass():
    """With momentum (DGC's correction) each rank compresses its velocity: the logged
    velocities equal the serial replay, and each step sent + residual = old residual +
    velocity, exactly."""
    size, m = 2, 0.9
    res = _ok(launch(size, dict(steps=8, bucket_cap_mb=CAP, hook="compress",
                                compress="topk:0.05", state={"momentum": m})), size)
    for k in range(size):
        log = res[k]["log"]
        for b in (0, 1):
            ent = [e for e in log if e["bucket"] == b]
            acc, vel = momentum_correction_naive([e["input"] for e in ent],
                                                 [e["sent"] for e in ent], m)
            for t, e in enumerate(ent):
                assert np.array_equal(e["velocity"], vel[t]), (k, b, t)
                assert np.array_equal(e["sent"] + e["residual"], acc[t]), (k, b, t)
    assert np.array_equal(res[0]["w"], res[1]["w"])


def test_qsgd_messages_vary_in_size_and_average():
    """QSGD's messages differ in length between ranks (its count is gathered first);
    without error feedback the residual stays zero and each result is the mean of the
    decoded messages."""
    size = 2
    res = _ok(launch(size, dict(steps=5, bucket_cap_mb=CAP, hook="compress",
                                compress="qsgd:4")), size)
    for t in range(len(res[0]["log"])):
        sent = [res[k]["log"][t]["sent"] for k in range(size)]
        for k in range(size):
            assert not res[k]["log"][t]["residual"].any()
            np.testing.assert_allclose(res[k]["log"][t]["output"], ddp_mean_naive(sent),
                                       rtol=1e-6, atol=1e-9)
    counts = {(t, k): np.count_nonzero(res[k]["log"][t]["sent"])
              for t in range(len(res[0]["log"])) for k in range(size)}
    assert len(set(counts.values())) > 1, counts


def test_buckets_rebuilt_under_compression_raise():
    """start_iter=0 compresses DDP's first iteration, whose single bucket DDP then
    splits: the memory no longer fits its bucket, and the error says to raise
    start_iter."""
    out = launch(2, dict(steps=3, bucket_cap_mb=CAP, hook="compress", compress="topk:0.1",
                         state={"start_iter": 0}))
    for r in range(2):
        assert out[r][0] == "error" and out[r][1] == "ValueError", out[r]
        assert "rebuilt its buckets" in out[r][2] and "start_iter" in out[r][2]


# ---- partial allreduce: rounds against the oracle --------------------------------------
#: rank 1 pauses before these steps: the others close rounds without it
SLEEPS = {3: {1: 0.4}, 6: {1: 0.4}, 7: {0: 0.3}}


@pytest.mark.parametrize("kind,late,average", [("solo", "drop", "size"),
                                               ("solo", "carry", "size"),
                                               ("majority", "carry", "size"),
                                               ("majority", "drop", "contributors")])
def test_partial_rounds_equal_oracle(kind, late, average, no_shm_leak):
    """Every round's result, on every rank, is tests/naive.py's partial allreduce over
    exactly the contributors the round reports (dropped or carried late gradients),
    divided as ``average`` says; every rank reports the same contributors; the runs
    include partial rounds; the replicas end equal."""
    size, steps = 2, 10
    res = _ok(launch(size, dict(steps=steps, bucket_cap_mb=CAP, hook=kind, sleep=SLEEPS,
                                state={"late": late, "average": average, "seed": 3})),
              size)
    partial = 0
    for b in (0, 1):
        inputs, outputs, masks, recs = contributions(res, b)
        assert len(masks) == steps - 2
        for k in range(size):
            assert [x["contributors"] for x in recs[k]] == [x["contributors"] for x in recs[0]]
        sums, _ = partial_allreduce_naive(inputs, masks, late)
        for r, m in enumerate(masks):
            div = size if average == "size" else bin(m).count("1")
            for k in range(size):
                np.testing.assert_allclose(outputs[k][r], sums[r] / div, rtol=2e-5,
                                           atol=1e-7, err_msg=f"bucket {b} round {r}")
        partial += sum(bin(m).count("1") < size for m in masks)
    assert partial > 0, "no partial round: the test did not exercise solo/majority"
    assert np.array_equal(res[0]["w"], res[1]["w"])


def test_three_ranks_solo_rounds_equal_oracle(no_shm_leak):
    size, steps = 3, 8
    res = _ok(launch(size, dict(steps=steps, bucket_cap_mb=CAP, hook="solo",
                                sleep={3: {2: 0.4}, 5: {0: 0.3, 1: 0.3}},
                                state={"late": "carry"})), size)
    for b in (0, 1):
        inputs, outputs, masks, _ = contributions(res, b)
        sums, _ = partial_allreduce_naive(inputs, masks, "carry")
        for r in range(len(masks)):
            for k in range(size):
                np.testing.assert_allclose(outputs[k][r], sums[r] / size, rtol=2e-5,
                                           atol=1e-7)
    assert all(np.array_equal(res[k]["w"], res[0]["w"]) for k in range(size))


@pytest.mark.parametrize("kind,late", [("solo", "carry"), ("majority", "drop")])
def test_mpi_backend_rounds_equal_oracle(kind, late):
    """The partial hook on the MPI backend (an MPICommunicator per bucket) under
    ``mpiexec -n 2``: every round equals the oracle over its reported contributors."""
    pytest.importorskip("mpi4py")
    import os
    import pickle
    import shutil
    import subprocess
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    near = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    mpiexec = near if os.path.exists(near) else shutil.which("mpiexec")
    if mpiexec is None:
        pytest.skip("no mpiexec (pip install mpich)")
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([here, os.path.dirname(here),
                                           os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run([mpiexec, "-n", "2", sys.executable,
                        os.path.join(here, "torch_ddp_workers.py"), kind, late],
                       capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0 and "OK mpi" in p.stdout, (p.stdout + p.stderr)[-3000:]
    path = next(ln.split(" ", 1)[1] for ln in p.stdout.splitlines() if ln.startswith("RESULT"))
    with open(path, "rb") as f:
        res = pickle.load(f)
    os.unlink(path)
    partial = 0
    for b in (0, 1):
        inputs, outputs, masks, _ = contributions(res, b)
        sums, _ = partial_allreduce_naive(inputs, masks, late)
        for r, m in enumerate(masks):
            for k in range(2):
                np.testing.assert_allclose(outputs[k][r], sums[r] / 2, rtol=2e-5, atol=1e-7)
        partial += sum(bin(m).count("1") < 2 for m in masks)
    assert partial > 0
    assert np.array_equal(res[0]["w"], res[1]["w"])


# ---- failures -----------------------------------------------------------------------------
@pytest.mark.parametrize("dead", [1, 0])
def test_dead_rank_raises_on_the_others(dead, no_shm_leak):
    """A rank that dies mid-run: the others' next wait raises RankFailure naming it
    (solo ranks run on until the depth bound holds them), and no segment is left (the
    owner, rank 0, closes its state; a killed owner's segments go with it)."""
    live = 1 - dead
    out = launch(2, dict(steps=60, bucket_cap_mb=CAP, hook="solo", die_at=(dead, 4),
                         destroy=False, state={"depth": 2, "timeout": 30.0}), timeout=60)
    assert dead not in out
    assert out[live][0] == "error" and out[live][1] == "RankFailure", out[live]
    assert f"rank {dead}" in out[live][2] and "died" in out[live][2]
    assert "partial_allreduce_hook, bucket" in out[live][2]


def test_silent_rank_times_out(no_shm_leak):
    """A rank that stays alive but stops calling: the others' sync round raises
    CollectiveTimeout after the state's timeout, naming the missing rank."""
    out = launch(2, dict(steps=20, bucket_cap_mb=CAP, hook="sync", hang_at=(1, 4),
                         hang_s=8.0, destroy=False, state={"timeout": 1.5}), timeout=40)
    assert out[0][0] == "error" and out[0][1] == "CollectiveTimeout", out[0]
    assert "timed out" in out[0][2] and "[1]" in out[0][2]


# ---- bad input (in this process) ---------------------------------------------------------
@pytest.mark.parametrize("spec,match", [("topk2:0.1", "spec such as"),
                                        ("bogus", "spec such as"),
                                        ("topk:0", r"ratio must be in \(0, 1\]"),
                                        ("topk:1.5", r"ratio must be in \(0, 1\]"),
                                        ("randomk:-0.1", r"ratio must be in \(0, 1\]"),
                                        (None, "got None")])
def test_bad_compressor_spec(spec, match):
    with pytest.raises(ValueError, match=match):
        hooks.CompressionState(spec)


@pytest.mark.parametrize("kw,err,match", [
    ({"kind": "eager"}, ValueError, "kind"),
    ({"late": "keep"}, ValueError, "late"),
    ({"average": "median"}, ValueError, "average"),
    ({"backend": "nccl"}, ValueError, "backend"),
    ({"depth": 0}, ValueError, "depth"),
    ({"timeout": 0}, ValueError, "timeout"),
    ({"start_iter": -1}, ValueError, "start_iter"),
    ({"record": "yes"}, TypeError, "record"),
    ({"mpi_comm": object()}, ValueError, "mpi_comm"),
])
def test_bad_partial_state(kw, err, match):
    with pytest.raises(err, match=match):
        hooks.PartialAllreduceState(**kw)


def test_bad_compression_state_arguments():
    with pytest.raises(TypeError, match="error_feedback"):
        hooks.CompressionState("topk:0.1", error_feedback="yes")
    with pytest.raises(ValueError, match="start_iter"):
        hooks.CompressionState("topk:0.1", start_iter=-2)
    with pytest.raises(ValueError, match="momentum"):
        hooks.CompressionState("topk:0.1", momentum=1.5)
    assert not hooks.CompressionState(TopK(ratio=0.1), error_feedback=False) \
        .compressor.error_feedback


@pytest.mark.parametrize("hook,state", [
    (hooks.compression_hook, hooks.PartialAllreduceState()),
    (hooks.compression_hook, None),
    (hooks.partial_allreduce_hook, hooks.CompressionState("topk:0.1")),
    (hooks.partial_allreduce_hook, "solo"),
])
def test_wrong_state_type(hook, state):
    with pytest.raises(TypeError, match="state must be a sgd_shm.torch.hooks"):
        hook(state, None)


def test_closed_state_refuses_rounds():
    st = hooks.PartialAllreduceState()
    st.close()
    with pytest.raises(CollectiveError, match="closed"):
        st.communicator(0, 10, np.float32)


# ---- the benchmark's summary (bench/torch_ddp.py) ---------------------------------------
def test_bench_summary_medians_and_ratios():
    """Medians over repetitions, a run that never reached the target counted as slower
    than any that did, speed-ups against the baseline's median, the findings' verdicts."""
    from bench import torch_ddp

    def row(part, mode, rep, acc, ttt=None, **kw):
        return dict(part=part, mode=mode, rep=rep, accuracy=acc, seconds=10.0, steps=100,
                    steps_per_s=10.0, history=[(1.0, 10, acc)], time_to_target=ttt, **kw)
    rows = [row("imbalance", "allreduce", r, a, t) for r, (a, t) in
            enumerate([(0.96, 4.0), (0.95, 6.0), (0.97, 5.0)])]
    rows += [row("imbalance", "solo", r, a, t, contributors=1.0) for r, (a, t) in
             enumerate([(0.95, 2.0), (0.94, None), (0.96, 4.0)])]
    rows += [row("imbalance", "majority", r, 0.9, None, contributors=1.5) for r in range(3)]
    sm = torch_ddp.summarize(rows, "imbalance", ("allreduce", "solo", "majority"), "allreduce")
    assert sm["allreduce"]["time_to_target"] == 5.0 and sm["allreduce"]["speedup"] == 1.0
    assert sm["solo"]["time_to_target"] == 4.0 and sm["solo"]["reached"] == 2
    assert sm["solo"]["speedup"] == pytest.approx(1.25)
    assert sm["solo"]["accuracy_vs_baseline"] == pytest.approx(-0.01)
    assert sm["majority"]["time_to_target"] is None and "speedup" not in sm["majority"]
    d = {"summary": {"imbalance": sm}, "target": 0.95, "imbalance": [1, 0.05], "data": "digits",
         "train_rows": 1437, "held_out": 360, "ranks": 2, "epochs": 3, "batch": 32,
         "late": "carry", "reps": 3, "lr": 0.2, "momentum": 0.0}
    text = torch_ddp.summary_markdown(d)
    assert "| solo | 4.00 s (2/3 reached) | 1.25x |" in text
    assert "solo: 1.25x as fast" in text and "claim holds" in text
    assert "majority: no time to compare" in text
