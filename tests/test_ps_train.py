"""The parameter-server driver: every policy trains; the closed form holds under
every policy (no update lost); every minibatch is applied at most once per
epoch (exactly once unless the run stops first); SaPS flags the straggler and
only it, and fast workers take its minibatches; a SIGKILLed worker does not
stop the run; checkpoints are atomic and resume continues; emulation and bad
input."""
import glob
import json
import os

import numpy as np
import pytest

from sgd_shm.data import make_rcv1_like
from sgd_shm.ps import WaitPolicy, load_checkpoint, train
from sgd_shm.ps import checkpoint as checkpoint_mod
from tests.naive import fixed_gradient_model


def _batches_per_partition(X, workers, batch_size=64):
    return -(-(-(-X.shape[0] // workers)) // batch_size)     # ceil(ceil(n / w) / b)


@pytest.fixture(scope="module")
def data():
    return make_rcv1_like(4000, 500, random_state=0)


@pytest.mark.parametrize("policy", ["asp", "bsp", "ssp", "saps"])
def test_every_policy_trains(data, policy, no_shm_leak):
    X, y = data
    r = train(X, y, n_workers=3, policy=policy, max_seconds=1.0, seed=0,
              slowdown={0: 2.0})
    assert r.updates > 50
    assert r.final_loss < 0.6 < np.log(2.0)           # from log(2) at w = 0
    assert r.history[0]["loss"] >= r.final_loss
    assert sum(w["pushes"] for w in r.workers) == r.updates
    assert r.killed == []
    # minibatches: none applied twice in an epoch (checked in train), none lost
    b = r.batches
    assert b["lost"] == 0 and sum(b["applied"]) == r.updates
    pushes = [w["pushes"] for w in r.workers]
    if policy == "bsp":
        assert max(pushes) - min(pushes) <= 1          # lockstep
    if policy == "ssp":
        assert max(pushes) - min(pushes) <= 3 + 1      # staleness bound s = n_workers
    if policy != "saps":
        assert sum(b["stolen_by_worker"]) == 0
    hist = np.array(r.staleness_hist)
    assert hist.shape == (3, 32) and hist.sum() == r.updates


def test_default_shards_fit_a_small_model(tmp_path):
    """n_shards=None (the default) takes 8 shards, or one per weight where the model has
    fewer: a 5-feature problem trains on 5 shards (the checkpoint's shard versions) and
    learns (held-out rows); asking for more shards than weights is refused, naming the
    fix; and the simulator takes the same rule."""
    from sgd_shm.sim import simulate
    rng = np.random.default_rng(0)
    X = rng.normal(size=(1200, 5))
    y = (X @ np.array([1.0, -2.0, 0.5, 0.0, 1.5]) > 0).astype(int)
    Xt, yt = X[1000:], y[1000:]
    X, y = X[:1000], y[:1000]
    path = tmp_path / "ck.npz"
    r = train(X, y, n_workers=2, policy="asp", epochs=5, eval_set=(Xt, yt), checkpoint=path,
              progress=False)
    assert len(load_checkpoint(path)["shard_versions"]) == 5
    assert r.val_score > 0.9
    with pytest.raises(ValueError, match=r"n_shards: 6 shards for 5 weights.*n_shards <= 5"):
        train(X, y, n_workers=2, epochs=1, n_shards=6, progress=False)
    assert simulate(X, y, n_workers=2, epochs=5, eval_set=(Xt, yt)).val_score > 0.9
    with pytest.raises(ValueError, match=r"n_shards: 6 shards for 5 weights"):
        simulate(X, y, n_workers=2, epochs=1, n_shards=6)


@pytest.mark.parametrize("policy, wait", [("asp", None), ("bsp", None), ("ssp", None),
                                          ("saps", None), ("asp", "randomized"),
                                          ("saps", "abort")])
def test_closed_form_under_every_policy(data, policy, wait, tmp_path):
    """Every worker pushes the same g: the weights end at exactly -lr * g times
    the number of pushes (times their scales, for SaPS's down-weighted ones),
    and every shard's version and the global version equal the pushes; also
    when pushes wait on held shards by a ski-rental policy and defer."""
    X, y = data
    d = X.shape[1]
    g = np.where(np.arange(d) % 3 == 0, 1.0, 0.5)     # powers of two: sums are exact
    lr = 2.0 ** -16
    r = train(X, y, n_workers=3, policy=policy, max_seconds=0.6, seed=1, lr=lr,
              slowdown={0: 4.0}, model=fixed_gradient_model(g),
              **({"window": 0.2} if policy == "saps" else {}),
              checkpoint=tmp_path / "end", checkpoint_every=100.0,
              wait=None if wait is None else WaitPolicy(spins=50, conflict=wait))
    k = r.updates
    assert k == sum(w["pushes"] for w in r.workers) > 30
    weight = sum(w["applied_weight"] for w in r.workers)
    ck = load_checkpoint(tmp_path / "end")             # written after the workers stopped
    assert ck["version"] == k and (ck["shard_versions"] == k).all()
    if wait == "abort":                  # held shards were deferred and applied later
        assert sum(w["deferred"] for w in r.workers) > 0
    if policy == "saps":
        np.testing.assert_allclose(ck["weights"], -lr * weight * g, rtol=1e-12)
    else:
        assert weight == k
        assert np.array_equal(ck["weights"], -lr * k * g)


@pytest.mark.exclusive
def test_saps_flags_the_straggler_and_only_it(data):
    """Worker 0 slowed 4x is flagged (and nobody else), and the others take its
    minibatches; with no slowdown nobody is flagged. Two workers: on this 2-core
    machine more workers than cores make every worker an intermittent
    straggler of the scheduler's making."""
    X, y = data
    r = train(X, y, n_workers=2, policy="saps", slowdown={0: 4.0}, max_seconds=2.0, seed=0)
    assert [w for _, w in r.detections] == [0]
    assert r.detections[0][0] < 2.0
    assert r.events[0][1:] == (0, True)
    assert r.workers[1]["dropped"] == 0
    assert r.workers[1]["stolen"] > 0 and r.workers[0]["stolen"] == 0
    assert r.batches["stolen_by_worker"] == [0, r.workers[1]["stolen"]]
    assert r.batches["lost"] == 0
    r = train(X, y, n_workers=2, policy="saps", max_seconds=2.0, seed=0)
    assert r.detections == [] and r.events == []


@pytest.mark.exclusive
def test_stealing_keeps_the_stragglers_data_in_pace(data):
    """Under ASP a 4x straggler's partition falls behind by epochs; under SaPS,
    after the detection, fast workers take its minibatches and its partition keeps
    pace with the others: counted from the trace, the minibatches of partition 0
    applied after the detection are about as many as partition 1's. (Partition 1
    runs at the fast worker's full rate before the detection and shares it after,
    so the end-of-run epoch counters alone do not show the pace.)"""
    X, y = data
    slow = {0: 4.0}
    asp = train(X, y, n_workers=2, policy="asp", slowdown=slow, max_seconds=2.0, seed=2)
    saps = train(X, y, n_workers=2, policy="saps", slowdown=slow, max_seconds=2.0, seed=2,
                 trace=1 << 17)
    assert not saps.trace.truncated
    ea = asp.batches["epochs"]
    assert ea[0] < 0.6 * ea[1]
    t_det = saps.detections[0][0]
    after = np.zeros(2, np.int64)
    for st in saps.trace.steps:
        mine = (st["applied"] >= 0) & (st["push0"] >= t_det)
        after += np.bincount(st["partition"][mine], minlength=2)
    assert after[1] > 100 and abs(after[0] - after[1]) <= 0.2 * after[1] + 2, after


@pytest.mark.parametrize("policy", ["bsp", "ssp", "saps"])
def test_worker_sigkilled_mid_run(data, policy, no_shm_leak):
    """A worker killed at a random moment of the run (mid-update or not): the
    others go on (BSP/SSP stop waiting for it), the run finishes and trains
    about as well as the run without the kill, at equal work (the same number of
    minibatches applied: a run bounded by seconds would compare the box's load)."""
    X, y = data
    ref = train(X, y, n_workers=3, policy=policy, epochs=120, seed=3)
    # the kill lands in the first third of the reference's length; a run that a
    # lighter load let finish before it is redone with an earlier kill
    when = float(np.random.default_rng().uniform(0.1, 0.3)) * ref.seconds
    for _ in range(4):
        r = train(X, y, n_workers=3, policy=policy, epochs=120, seed=3, faults={1: when})
        if r.killed:
            break
        when /= 2
    assert r.killed == [1], f"killed at {when:.3f} s of a {ref.seconds:.3f} s reference"
    # the survivors kept going: the version grew long after the kill (a survivor's own
    # push count may stay below the killed worker's when SaPS flags it on a busy box)
    before = max((h["step"] for h in r.history if h["seconds"] <= when), default=0)
    assert r.history[-1]["step"] - before > 100, (when, r.history)
    pushes = [w["pushes"] for w in r.workers]
    assert pushes[0] + pushes[2] > pushes[1]
    assert r.final_loss < ref.final_loss + 0.02
    assert r.final_loss < 0.6
    # at most the batch it held, or the unqueued rest of an epoch it was enqueueing
    assert r.batches["lost"] <= 1 + _batches_per_partition(X, 3)
    if policy == "saps":                                # its queue was taken over
        assert sum(r.batches["stolen_by_worker"]) > 0


def test_repeated_kills_never_deadlock(data, no_shm_leak):
    """Workers SIGKILLed at random moments, over and over: whatever a worker was
    doing (pushing under a shard lock, refilling a queue, waiting at the BSP
    barrier, checking the stop flag), the survivors finish the run. (A
    multiprocessing Event would not do as the stop flag: a worker killed inside
    is_set() leaves its internal lock held.)"""
    X, y = data
    rng = np.random.default_rng()
    for policy in ("bsp", "saps", "asp", "ssp", "saps"):
        when = {0: float(rng.uniform(0.02, 0.3)), 2: float(rng.uniform(0.02, 0.3))}
        r = train(X, y, n_workers=3, policy=policy, max_seconds=0.5, seed=7, faults=when)
        assert sorted(r.killed) == [0, 2], (policy, when)
        assert r.workers[1]["pushes"] > 0                 # see test_worker_sigkilled_mid_run
        assert r.batches["lost"] <= 2 * (1 + _batches_per_partition(X, 3))


def test_last_worker_killed(data, no_shm_leak):
    """The only worker is killed: the run ends at once, reports it, and leaves no
    lock held (one it died holding is released) and no segment behind."""
    X, y = data
    for when in (0.05, 0.2):
        r = train(X, y, n_workers=1, policy="asp", max_seconds=5.0, seed=8, faults={0: when})
        assert r.killed == [0] and r.seconds < 5.0


def test_workers_exit_when_the_coordinator_is_killed(tmp_path):
    """SIGKILL the process running train(): its worker processes notice and exit
    instead of spinning on as orphans, and then the resource tracker unlinks the
    run's segments (it waits for every process that inherited its pipe)."""
    import signal
    import subprocess
    import sys
    import time
    script = tmp_path / "run.py"
    script.write_text(
        "import sys\n"
        "from sgd_shm.data import make_rcv1_like\n"
        "from sgd_shm.ps import train\n"
        "X, y = make_rcv1_like(4000, 500, random_state=0)\n"
        "print('ready', flush=True)\n"
        "train(X, y, n_workers=2, policy=sys.argv[1], max_seconds=60, seed=0)\n")
    for policy in ("asp", "bsp"):
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        p = subprocess.Popen([sys.executable, str(script), policy], stdout=subprocess.PIPE,
                             text=True, env={**os.environ, "PYTHONPATH": root})
        assert p.stdout.readline().strip() == "ready"
        kids = []
        for _ in range(200):                 # wait for the two workers to be forked
            time.sleep(0.05)
            with open(f"/proc/{p.pid}/task/{p.pid}/children") as f:
                kids = [int(x) for x in f.read().split()]
            if len(kids) >= 3:               # the resource tracker and two workers
                break
        time.sleep(0.3)
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        deadline = time.time() + 10
        alive = kids
        left = ["?"]
        while (alive or left) and time.time() < deadline:
            time.sleep(0.1)
            alive = [k for k in kids if _running(k)]
            left = [n for n in os.listdir("/dev/shm") if n.startswith(f"rlx_{p.pid}_")]
        assert alive == [], f"{policy}: orphans still running: {alive}"
        assert left == [], f"{policy}: segments left in /dev/shm: {left}"


def _running(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def test_checkpoint_and_resume(data, tmp_path, no_shm_leak):
    X, y = data
    path = tmp_path / "ps.ckpt"
    r = train(X, y, n_workers=2, policy="asp", max_seconds=1.0, seed=4, checkpoint=path,
              checkpoint_every=0.25)
    assert len(r.checkpoints) >= 3                      # periodic ones and the last
    times = [t for t, _ in r.checkpoints]
    assert times == sorted(times)
    ck = load_checkpoint(path)
    assert ck["version"] == r.updates                   # the last is taken at the end
    assert (ck["shard_versions"] == r.updates).all()
    assert ck["pushes"].tolist() == [w["pushes"] for w in r.workers]
    assert ck["epochs"].tolist() == r.batches["epochs"]
    assert ck["meta"]["policy"] == "asp" and ck["meta"]["n_features"] == X.shape[1]
    assert abs(ck["meta"]["loss_value"] - r.final_loss) < 1e-12
    assert glob.glob(str(tmp_path / ".*tmp*")) == []
    r2 = train(X, y, n_workers=2, policy="asp", max_seconds=0.5, seed=4, resume=path)
    assert r2.resumed_from["version"] == r.updates
    assert r2.history[0]["seconds"] >= ck["seconds"]
    assert r2.history[0]["loss"] < r.final_loss + 0.01 < np.log(2.0)
    assert r2.updates > r.updates
    assert [w["pushes"] for w in r2.workers] >= [w["pushes"] for w in r.workers]
    assert r2.batches["lost"] == 0


def test_checkpoints_taken_while_workers_push_resume(data, tmp_path, no_shm_leak):
    """A checkpoint taken mid-run reads the global version before the shards, so its
    shards may be ahead of it: every one written during the run loads and resumes (a
    check that shards <= version refused about half of them)."""
    X, y = data
    path = tmp_path / "mid.ckpt"
    seen = []

    def read(rec):
        if path.exists():
            ck = load_checkpoint(path)                   # raises on a refused one
            seen.append(bool((ck["shard_versions"] > ck["version"]).any()))
    train(X, y, n_workers=2, policy="asp", n_shards=8, max_seconds=1.0, seed=1,
          checkpoint=path, checkpoint_every=0.02, sample_every=0.02, callbacks=[read])
    assert len(seen) >= 5
    r = train(X, y, n_workers=2, policy="asp", max_seconds=0.2, seed=1, resume=path)
    assert r.resumed_from is not None


def test_rps_resumes_from_any_checkpoint(data, tmp_path, no_shm_leak):
    """A replicated run goes on in rounds from the checkpoint's version, whatever wrote
    it: an RPS run of other workers, or an ASP run whose workers pushed unequally (the
    round barrier waited forever, or idled to max_seconds, before)."""
    X, y = data
    rps, asp = tmp_path / "rps.ckpt", tmp_path / "asp.ckpt"
    first = train(X, y, n_workers=2, policy="rps", epochs=1, seed=0, checkpoint=rps)
    rounds = first.updates
    again = train(X, y, n_workers=3, policy="rps", epochs=1, seed=0, resume=rps,
                  max_seconds=60)
    per = again.batches["applied"]                       # one epoch: each its partition's
    assert per[0] > 0 and per == [per[0]] * 3 and again.batches["epochs"] == [1, 1, 1]
    assert again.updates == rounds + per[0]              # its rounds, after the first run's
    assert [w["pushes"] for w in again.workers] == [again.updates] * 3
    a = train(X, y, n_workers=2, policy="asp", max_seconds=0.3, seed=0, checkpoint=asp)
    r = train(X, y, n_workers=2, policy="rps", epochs=1, seed=0, resume=asp, max_seconds=60)
    assert r.updates > a.updates and r.batches["lost"] == 0 and r.killed == []
    assert r.seconds - load_checkpoint(asp)["seconds"] < 30


def test_checkpoint_write_is_atomic(data, tmp_path, monkeypatch):
    """A write that fails halfway leaves the previous checkpoint whole and no
    temporary file behind."""
    X, y = data
    path = tmp_path / "ps.ckpt"
    train(X, y, n_workers=1, policy="asp", max_seconds=0.3, seed=5, checkpoint=path)
    before = path.read_bytes()

    def torn(f, **arrays):
        f.write(b"PK\x03\x04 half a zip file")
        raise OSError("disk full")
    monkeypatch.setattr(checkpoint_mod.np, "savez", torn)
    with pytest.raises(OSError, match="disk full"):
        train(X, y, n_workers=1, policy="asp", max_seconds=0.3, seed=5, checkpoint=path)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert load_checkpoint(path)["version"] > 0
    assert sorted(os.listdir(tmp_path)) == ["ps.ckpt"]


def test_resume_rejects_bad_checkpoints(data, tmp_path):
    X, y = data
    with pytest.raises(ValueError, match="resume: no checkpoint"):
        train(X, y, resume=tmp_path / "missing")
    (tmp_path / "junk").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="not a readable checkpoint"):
        train(X, y, resume=tmp_path / "junk")
    path = tmp_path / "ok"
    train(X, y, n_workers=1, max_seconds=0.2, checkpoint=path)
    with pytest.raises(ValueError, match="features"):
        train(X[:, :100], y, resume=path)
    # a checkpoint cut short (a copy that stopped half-way) and one holding pickles
    (tmp_path / "cut").write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ValueError, match="'.*cut' is not a readable checkpoint"):
        train(X, y, resume=tmp_path / "cut")
    np.save(tmp_path / "pickles.npy", np.array([{"a": 1}], dtype=object))
    with pytest.raises(ValueError, match=r"readable checkpoint \(not an archive of plain arr"):
        train(X, y, resume=tmp_path / "pickles.npy")
    from sgd_shm.models import SoftmaxRegression
    with pytest.raises(ValueError, match="this run's model has"):
        train(X, y, resume=path, model=SoftmaxRegression(X.shape[1], 2))
    shards = len(load_checkpoint(path)["shard_versions"])     # (another was ignored)
    with pytest.raises(ValueError, match=rf"n_shards: the checkpoint was written with "
                                         rf"{shards} shards.*pass n_shards={shards} or None"):
        train(X, y, n_workers=1, max_seconds=0.2, resume=path, n_shards=shards + 1)
    train(X, y, n_workers=1, max_seconds=0.2, resume=path, n_shards=shards)


@pytest.mark.parametrize("field, value, words", [
    ("version", np.array([1, 2]), "version .* is not an int >= 0"),
    ("version", np.int64(-1), "version .* is not an int >= 0"),
    ("epochs", np.array([1, 2]), "pushes and epochs are not ints >= 0, one of each per worker"),
    ("pushes", np.array([-5]), "pushes and epochs"),
    ("seconds", np.float64(np.nan), "seconds nan is not a finite number"),
    ("seconds", np.float64(-1.0), "seconds -1.0"),
    ("weights", "column", r"weights of shape \(\d+, 1\)"),
    ("weights", "nan", "weights hold NaN or inf"),
    ("shard_versions", "negative", r"shard_versions are not ints >= 0, one per shard"),
    ("meta", np.array(json.dumps([1, 2])), "is not a checkpoint of format"),
])
def test_resume_rejects_inconsistent_checkpoints(data, tmp_path, field, value, words):
    """A checkpoint whose arrays disagree is refused when read, by name (a short epochs
    array failed after the run, a NaN clock went into the history, a list meta or an
    array version raised raw errors)."""
    X, y = data
    path = tmp_path / "ok"
    train(X, y, n_workers=1, policy="asp", max_seconds=0.2, checkpoint=path)
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    if isinstance(value, str):
        w, sv = arrays["weights"], arrays["shard_versions"]
        value = {"column": w[:, None], "nan": np.full_like(w, np.nan),
                 "negative": sv - sv - 1}[value]
    arrays[field] = value
    bad = tmp_path / "bad.ckpt"
    with open(bad, "wb") as f:
        np.savez(f, **arrays)
    with pytest.raises(ValueError, match=words):
        train(X, y, n_workers=1, max_seconds=0.2, resume=bad)
    np.save(tmp_path / "one.npy", arrays["weights"])          # one array: not a checkpoint
    with pytest.raises(ValueError, match=r"not a readable checkpoint \(one array"):
        load_checkpoint(tmp_path / "one.npy")


def test_checkpoint_path_is_checked_before_the_run(data, tmp_path):
    """A folder given as the checkpoint is refused at the start, with the fix, not by the
    first write after training has begun."""
    X, y = data
    with pytest.raises(ValueError, match="checkpoint: .* is a folder; give a file path"):
        train(X, y, n_workers=1, max_seconds=5, checkpoint=tmp_path)
    with pytest.raises(ValueError, match="checkpoint: folder .* does not exist"):
        train(X, y, n_workers=1, max_seconds=5, checkpoint=tmp_path / "no" / "ck")
    with pytest.raises(ValueError, match="checkpoint: an empty path"):
        train(X, y, n_workers=1, max_seconds=5, checkpoint="")


def test_emulation_profiles_and_transient_spells(data):
    X, y = data
    r = train(X, y, n_workers=3, policy="asp", slowdown="hetero", max_seconds=0.8, seed=6,
              transient=(20.0, 3.0, 0.01))
    assert [w["slowdown"] for w in r.workers] == [4.0, 2.0, 1.0]
    assert all(w["spells"] > 0 for w in r.workers)
    r = train(X, y, n_workers=2, policy="asp", slowdown="straggler", max_seconds=0.3, seed=6)
    assert [w["slowdown"] for w in r.workers] == [4.0, 1.0]


def test_progress_bar(data, capsys):
    X, y = data
    train(X, y, n_workers=1, policy="asp", max_seconds=0.3, seed=0, progress=True)
    err = capsys.readouterr().err
    assert "asp" in err and "updates" in err and "loss" in err


def test_target_loss_stops_early(data):
    X, y = data
    r = train(X, y, n_workers=2, policy="asp", max_seconds=20.0, target_loss=0.65, seed=1)
    assert r.time_to_target is not None and r.seconds < 20.0
    assert min(h["loss"] for h in r.history) <= 0.65


def test_divergence_is_an_error(data, no_shm_leak):
    X, y = data
    with pytest.raises(FloatingPointError, match="diverged"):
        train(X * 1e6, y, n_workers=2, loss="squared_error", lr=1e6, max_seconds=5.0)


def test_bad_input(data):
    X, y = data
    with pytest.raises(ValueError, match="policy"):
        train(X, y, policy="gossip")
    with pytest.raises(ValueError, match="loss"):
        train(X, y, loss="cross_entropy")
    with pytest.raises(ValueError, match="slowdown"):
        train(X, y, n_workers=2, slowdown=[1.0])
    with pytest.raises(ValueError, match="slowdown"):
        train(X, y, n_workers=2, slowdown={5: 2.0})
    with pytest.raises(ValueError, match="slowdown: profile"):
        train(X, y, n_workers=2, slowdown="slow")
    with pytest.raises(ValueError, match=">= 1"):
        train(X, y, n_workers=2, slowdown=[0.5, 1.0])
    with pytest.raises(ValueError, match="transient"):
        train(X, y, transient=(1.0, 0.5, 1.0))
    with pytest.raises(ValueError, match="transient"):
        train(X, y, transient="often")
    with pytest.raises(ValueError, match="two classes"):
        train(X, np.arange(X.shape[0]) % 3)
    with pytest.raises(ValueError, match="rows"):
        train(X, y[:-1])
    with pytest.raises(ValueError, match="max_seconds"):
        train(X, y, max_seconds=0)
    with pytest.raises(ValueError, match="batch_size"):
        train(X, y, batch_size=0)
    Xd = X[:50].toarray()
    Xd[3, 4] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        train(Xd, y[:50])
    with pytest.raises(ValueError, match="faults"):
        train(X, y, n_workers=2, faults={2: 0.1})
    # a bool worker (True killed worker 1), a word for seconds, a list (raw errors before)
    for bad, err, match in (({True: 0.0}, TypeError, r"faults: expected \{worker in"),
                            ({0: "a"}, TypeError, "faults: must be a number"),
                            ([0.1], TypeError, r"faults: expected \{worker: seconds\} "
                                               r"\(a dict\), got list")):
        with pytest.raises(err, match=match):
            train(X, y, n_workers=2, faults=bad)
    with pytest.raises(ValueError, match="slowdown: expected a profile name"):
        train(X, y, n_workers=2, slowdown=[1, True])      # (True was a factor of 1)
    with pytest.raises(ValueError, match="n_workers: X has only 3 rows"):
        train(X[:3], np.array([1.0, -1.0, 1.0]), n_workers=4)
    with pytest.raises(TypeError, match="wait"):
        train(X, y, wait="randomized")
    with pytest.raises(ValueError, match="checkpoint: folder"):
        train(X, y, checkpoint="/nonexistent-folder/ps.ckpt")
