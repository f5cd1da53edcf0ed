"""The training core that Hogwild, the parameter server and eager-SGD share: the
import graph (trainers -> core, never trainer -> trainer), one model path (no
"model is None" branch), explicit signatures, one divergence error, argument checks,
the result family (records, held-out score, to_dict, repr) and callbacks."""
from __future__ import annotations

import ast
import inspect
import json
import pathlib

import numpy as np
import pytest

from sgd_shm import eager, ps
from sgd_shm.core import DivergenceError, ParameterError
from sgd_shm.core.results import EVAL_KEYS, HISTORY_KEYS
from sgd_shm.data import make_rcv1_like
from sgd_shm.sim import simulate

PKG = pathlib.Path(__file__).resolve().parents[1] / "sgd_shm"
TRAINERS = ("hogwild", "ps", "eager")


@pytest.fixture(scope="module")
def data():
    X, y = make_rcv1_like(3000, 300, random_state=0)
    return X[:2400], y[:2400], X[2400:], y[2400:]


def _imports(path):
    """Every module a file names in an import (absolute names), at any depth (function
    bodies too): relative imports resolved against the file's package, and the literal
    names given to ``importlib.import_module`` and ``__import__``."""
    package = ".".join(("sgd_shm",) + path.relative_to(PKG).parent.parts)
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            mod = ".".join(p for p in (base, node.module) if p)
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif (isinstance(node, ast.Call) and node.args
              and isinstance(node.args[0], ast.Constant)
              and getattr(node.func, "attr", getattr(node.func, "id", None))
              in ("import_module", "__import__")):
            out.add(str(node.args[0].value))
    return out


def _owner(module):
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "sgd_shm" else None


def test_trainers_import_the_core_and_never_each_other():
    for trainer in TRAINERS:
        for path in (PKG / trainer).rglob("*.py"):
            others = {m for m in _imports(path) if _owner(m) in TRAINERS and _owner(m) != trainer}
            assert not others, f"{path.relative_to(PKG)} imports {sorted(others)}"
    # the simulator too: the calibration, which runs the real trainers, lives above
    # both in sgd_shm.calibrate
    for part in ("core", "models", "collectives", "torch", "sim"):
        for path in (PKG / part).rglob("*.py"):
            bad = {m for m in _imports(path) if _owner(m) in TRAINERS}
            assert not bad, f"{path.relative_to(PKG)} imports trainers {sorted(bad)}"


def test_no_trainer_branches_on_a_missing_model():
    hits = [f"{p.relative_to(PKG)}:{i + 1}" for p in PKG.rglob("*.py")
            for i, line in enumerate(p.read_text().splitlines()) if "model is None" in line]
    assert hits == []


@pytest.mark.parametrize("fn", [ps.train, eager.train])
def test_trainers_have_explicit_signatures(fn):
    params = inspect.signature(fn).parameters
    assert not any(p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL) for p in params.values())
    assert not any(n.startswith("_") for n in params)
    for name in ("n_workers", "seed", "lr", "loss", "alpha", "model", "compress", "epochs",
                 "eval_set", "callbacks", "progress"):
        assert name in params, name
    assert params["seed"].default == 0 and params["loss"].default is None


def test_estimator_signatures_list_every_parameter():
    from sgd_shm import (HogwildClassifier, HogwildMLPClassifier, HogwildRegressor,
                         MatrixFactorization)
    for est in (HogwildClassifier, HogwildRegressor, HogwildMLPClassifier,
                MatrixFactorization, ps.ParameterServerClassifier):
        params = inspect.signature(est.__init__).parameters
        assert not any(p.kind == p.VAR_KEYWORD for p in params.values()), est
        assert set(est().get_params()) == set(params) - {"self"}


@pytest.mark.parametrize("trainer", ["ps", "eager", "hogwild"])
def test_every_trainer_raises_divergence_error(data, trainer, no_shm_leak):
    X, y = data[:2]
    Xb = X * 1e6                               # a step this large overflows at once
    with pytest.raises(DivergenceError) as e:
        if trainer == "ps":
            ps.train(Xb, y, n_workers=1, policy="asp", lr=1e6, loss="squared_error",
                     max_seconds=10, progress=False)
        elif trainer == "eager":
            eager.train(Xb, y, n_workers=1, lr=1e6, loss="squared_error", max_seconds=10,
                        progress=False)
        else:
            from sgd_shm import HogwildRegressor
            HogwildRegressor(eta0=1e300, learning_rate="constant", n_workers=1,
                             random_state=0).fit(Xb, y.astype(float))
    assert isinstance(e.value, FloatingPointError)


def test_ps_classifier_fixed_seed_one_worker_fits_the_same_model_twice(data):
    X, y = data[:2]
    a = ps.ParameterServerClassifier(n_workers=1, max_iter=2, random_state=3).fit(X, y)
    b = ps.ParameterServerClassifier(n_workers=1, max_iter=2, random_state=3).fit(X, y)
    assert np.array_equal(a.coef_, b.coef_) and a.result_.updates == b.result_.updates > 0


@pytest.mark.parametrize("fn", [ps.train, eager.train])
@pytest.mark.parametrize("kw, exc, words", [
    ({"lr": "0.1"}, TypeError, "lr: must be a number"),
    ({"progress": "yes"}, TypeError, "progress: must be True or False"),
    ({"batch_size": 2.5}, TypeError, "batch_size: must be an int"),
    ({"n_workers": 0}, ValueError, "n_workers.*-1"),
    ({"eval_set": "held-out"}, TypeError, "eval_set"),
    ({"callbacks": [1]}, TypeError, "callbacks"),
])
def test_bad_arguments_name_the_rule(data, fn, kw, exc, words):
    X, y = data[:2]
    with pytest.raises(exc, match=words) as e:
        fn(X, y, **{"max_seconds": 5, **kw})
    if exc is TypeError:
        assert isinstance(e.value, ParameterError) and isinstance(e.value, ValueError)


@pytest.mark.parametrize("fn", [ps.train, eager.train])
def test_non_numeric_X_is_refused_by_name(data, fn):
    """Strings are refused even where numpy would parse them ("0.5"), as scikit-learn
    does; a value that does not convert is a ValueError naming X, not numpy's message
    alone. Numbers in an object array or a list of lists train."""
    X, y = data[:2]
    Xd = np.asarray(X[:200].toarray() if hasattr(X, "toarray") else X[:200])
    with pytest.raises(ValueError, match="X: expected numbers, got an array of strings"):
        fn(Xd.astype(str), y[:200], epochs=1, progress=False)
    bad = Xd.astype(object)
    bad[3, 1] = "n/a"
    with pytest.raises(ValueError, match="X: expected numbers.*'n/a'"):
        fn(bad, y[:200], epochs=1, progress=False)
    r = fn(Xd.astype(object).tolist(), y[:200], n_workers=2, epochs=1, progress=False)
    assert np.isfinite(r.final_loss)



@pytest.mark.parametrize("fn", [ps.train, eager.train, simulate])
def test_labels_a_classifier_cannot_learn_are_refused(data, fn):
    """One class, or regression targets, get the reason and the way out (at least two
    classes; HogwildRegressor for regression), not a hint to build a model with one
    output per distinct target value. Labels of any type, strings too, train."""
    X, y = data[:2]
    kw = {"n_workers": 2, "epochs": 1}
    if fn is not simulate:
        kw["progress"] = False
    with pytest.raises(ValueError, match=r"y: holds a single class \(\[1\]\)"):
        fn(X, np.ones(len(y), dtype=np.int64), **kw)
    targets = np.random.default_rng(0).normal(size=len(y))
    with pytest.raises(ValueError, match="y: holds non-integer values.*HogwildRegressor"):
        fn(X, targets, loss="squared_error", **kw)
    assert np.isfinite(fn(X, np.where(y > 0, "spam", "ham"), **kw).final_loss)


def test_too_many_shards_is_an_error_not_a_clamp(data):
    X, y = data[:2]
    with pytest.raises(ValueError, match="n_shards: 1000 shards for 300 weights"):
        ps.train(X, y, n_shards=1000, max_seconds=5, progress=False)


@pytest.mark.parametrize("trainer", ["ps", "eager"])
def test_results_share_records_held_out_score_and_to_dict(data, trainer, no_shm_leak):
    X, y, Xv, yv = data
    fn = ps.train if trainer == "ps" else eager.train
    kw = {"policy": "asp"} if trainer == "ps" else {}
    r = fn(X, y, n_workers=2, epochs=3, max_seconds=60, eval_set=(Xv, yv), progress=False,
           **kw)
    assert r.history and all(tuple(h) == HISTORY_KEYS + EVAL_KEYS for h in r.history)
    assert r.val_score == r.score(Xv, yv) and r.val_score > 0.6
    with pytest.raises(ValueError, match="y: expected one label per row of X"):
        r.score(Xv, yv[:1])                 # would broadcast into a number otherwise
    bad = Xv.toarray() if hasattr(Xv, "toarray") else np.array(Xv, dtype=np.float64)
    bad[0, 0] = np.nan                      # a score of NaN rows was a number
    with pytest.raises(ValueError, match="X: contains NaN or infinite values"):
        r.score(bad, yv)
    with pytest.raises(ValueError, match="eval_set: contains NaN"):
        fn(X, y, n_workers=2, epochs=1, eval_set=(bad, yv), progress=False, **kw)
    with pytest.raises(ValueError, match="eval_set: X_val has no rows"):
        fn(X, y, n_workers=2, epochs=1, eval_set=(Xv[:0], yv[:0]), progress=False, **kw)
    assert r.history[-1]["val_score"] == r.val_score and r.history[-1]["val_loss"] == r.val_loss
    if trainer == "eager":       # the first record is at the initial (zero) weights: all class 0
        assert r.history[0]["val_score"] == np.mean(yv == r.classes_[0])
    t = r.time_to_score(r.val_score)
    assert t is not None and t <= r.seconds and r.time_to_score(1.01) is None
    no_eval = fn(X, y, n_workers=2, epochs=1, progress=False, **kw)
    assert all(tuple(h) == HISTORY_KEYS for h in no_eval.history)
    with pytest.raises(ValueError, match="eval_set"):
        no_eval.time_to_score(0.5)
    np.testing.assert_allclose(r.val_loss, r.model.loss(r.coef_, r.model.prepare(
        Xv, (yv == r.classes_[1]).astype(int))))
    d = json.loads(json.dumps(r.to_dict()))
    assert d["final_loss"] == r.final_loss and d["val_score"] == r.val_score
    assert "coef_" not in d and len(d["history"]) == len(r.history)
    assert "\n" not in repr(r) and len(repr(r)) < 200 and "val_score" in repr(r)


@pytest.mark.parametrize("trainer", ["ps", "eager"])
def test_a_callback_sees_every_record_and_can_stop_the_run(data, trainer, tmp_path,
                                                           no_shm_leak):
    """A callback is called with each history record (on eager-SGD in rank 0's
    process, so it writes to a file here) and a True return stops the run."""
    X, y = data[:2]
    log = tmp_path / "records.jsonl"

    def stop_at_third(record):
        with open(log, "a") as f:
            f.write(json.dumps(record) + "\n")
        return sum(1 for _ in open(log)) >= 3

    fn = ps.train if trainer == "ps" else eager.train
    r = fn(X, y, n_workers=2, max_seconds=30, sample_every=0.05, callbacks=stop_at_third,
           progress=False)
    seen = [json.loads(line) for line in open(log)]
    assert r.seconds < 10                          # stopped long before max_seconds
    assert len(seen) >= 3 and all(s in r.history for s in seen)
    # every record, from the first (eager-SGD's start record skipped the callbacks and
    # the target: a target the start met was noted and the run went on)
    assert seen == r.history[:len(seen)]
    met = fn(X, y, n_workers=2, max_seconds=30, sample_every=0.05, target_loss=100.0,
             progress=False)
    assert met.time_to_target == met.history[0]["seconds"] and met.seconds < 10


def _linear_with(name, **methods):
    """A Linear model whose named methods break the contract (a test's subclass)."""
    from sgd_shm.models import Linear
    return type(name, (Linear,), methods)


@pytest.mark.parametrize("ret, err, match", [
    (lambda n: np.zeros(n + 1), ValueError, r"BadInit.init returned shape \(\d+,\); the "
                                            r"weights are a flat vector of the model's n_params"),
    (lambda n: np.zeros((n, 1)), ValueError, "returned shape"),
    (lambda n: None, ValueError, r"returned shape \(\)"),
    (lambda n: np.full(n, np.nan), ValueError, "NaN or infinite weights"),
    (lambda n: "w", TypeError, "must return the initial weights as a float array")])
def test_a_models_init_is_checked_by_every_trainer(data, ret, err, match):
    """The model contract's init is checked where a run starts, the same in every
    trainer (eager-SGD failed inside a rank with numpy's words; the parameter server
    took None for zeros)."""
    from sgd_shm.sim import simulate
    X, y = data[:2]
    model = _linear_with("BadInit", init=lambda self, rng: ret(self.n_params))(X.shape[1])
    for fn in (ps.train, eager.train):
        with pytest.raises(err, match=match):
            fn(X, y, n_workers=2, epochs=1, model=model, progress=False)
    with pytest.raises(err, match=match):
        simulate(X, y, n_workers=2, epochs=1, model=model)


@pytest.mark.parametrize("ret", [np.zeros(3), None, "0.5", True])
def test_a_models_loss_must_be_a_number(data, ret):
    """A loss_grad that returns no number fails naming it, in every trainer (float()'s
    or numpy's words before)."""
    from sgd_shm.models import Linear, Model

    def loss_grad(self, w, data, rows, grad, block=None):
        Linear.loss_grad(self, w, data, rows, grad, block)
        return ret
    X, y = data[:2]
    # the contract's loss, through loss_grad (Linear's own loss does not call it)
    model = _linear_with("BadLoss", loss=Model.loss, loss_grad=loss_grad)(X.shape[1])
    for fn in (ps.train, eager.train):
        with pytest.raises(TypeError, match="BadLoss.loss_grad must return the loss as one "
                                            "number"):
            fn(X, y, n_workers=2, epochs=1, model=model, progress=False)


def test_a_binary_models_one_score_predicts_through_the_contract(data):
    """A binary model may give one score per row (the contract says so): the contract's
    own predict and predict_proba then read it as the positive class's score (numpy's
    axis error before); scores of another shape are named."""
    from sgd_shm.models import Model
    X, y, Xte, yte = data
    one = _linear_with("OneScore", predict=Model.predict,
                       predict_proba=Model.predict_proba)(X.shape[1])
    r = ps.train(X, y, n_workers=2, epochs=2, model=one, eval_set=(Xte, yte), progress=False,
                 seed=0)
    z = np.asarray(Xte @ r.coef_).ravel()
    np.testing.assert_array_equal(r.predict(Xte), r.classes_[(z > 0).astype(int)])
    np.testing.assert_allclose(r.predict_proba(Xte)[:, 1], 1 / (1 + np.exp(-z)), rtol=1e-12)
    assert r.score(Xte, yte) == np.mean(r.predict(Xte) == yte) > 0.6
    assert r.history[-1]["val_score"] == pytest.approx(r.score(Xte, yte))
    for cols in (1, 3):
        bad = _linear_with("BadScores", predict=Model.predict, predict_proba=Model.predict_proba,
                           decision_function=lambda self, w, X, k=cols: np.zeros((X.shape[0], k))
                           )(X.shape[1])
        for call in (bad.predict, bad.predict_proba):
            with pytest.raises(ValueError, match=r"BadScores.decision_function must return "
                                                 r"scores of shape \(600, 2\) or \(600,\) "
                                                 r"\(the positive class's score\), got shape "
                                                 rf"\(600, {cols}\)"):
                call(r.coef_, Xte)


def test_epochs_are_the_default_stopping_rule():
    """With neither epochs nor max_seconds both trainers run DEFAULT_EPOCHS epochs (the
    same work on any machine); max_seconds alone is a wall clock with no epoch limit."""
    from sgd_shm.core.validation import DEFAULT_EPOCHS
    X, y = make_rcv1_like(640, 20, random_state=0)
    r = ps.train(X, y, n_workers=1, policy="asp", batch_size=64, progress=False)
    assert r.epochs == DEFAULT_EPOCHS and r.history[-1]["step"] == DEFAULT_EPOCHS * 10
    e = eager.train(X, y, n_workers=2, batch_size=32, progress=False)
    assert e.rounds == DEFAULT_EPOCHS * 640 // 64
    timed = eager.train(X, y, n_workers=2, batch_size=32, max_seconds=0.3, progress=False)
    assert timed.seconds >= 0.3                   # ran to the clock, no epoch limit
    with pytest.raises(ValueError, match="max_seconds"):
        ps.train(X, y, max_seconds=0)
