"""scikit-learn parity of the Hogwild estimators: float32 input without a float64 copy,
class_weight, warm_start / coef_init, average (ASGD), early_stopping, against
SGDClassifier / SGDRegressor on one worker (samples in order, so that both take the
same steps) and against a plain serial oracle; scikit-learn's checks with the new
parameters; bad values; plots that take a figure and leave the backend alone."""
import math
import tracemalloc
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import load_breast_cancer, load_iris, make_regression
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import SGDClassifier, SGDRegressor
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import check_estimator

import sgd_shm.hogwild.estimators as E
from naive import serial_sgd_epoch
from sgd_shm import HogwildClassifier, HogwildRegressor
from sgd_shm.hogwild import HogwildSGD, Problem


def _scaled(loader):
    X, y = loader(return_X_y=True)
    return StandardScaler().fit_transform(X), y


XB, YB = _scaled(load_breast_cancer)          # binary, 569 x 30
XI, YI = _scaled(load_iris)
_KEEP = np.r_[0:50, 50:80, 100:115]
XI, YI = XI[_KEEP], YI[_KEEP]                 # three classes of 50, 30 and 15 samples
XR, YR = make_regression(n_samples=300, n_features=8, noise=1.0, random_state=0)
XR = StandardScaler().fit_transform(XR)
YR = YR / YR.std()
#: the same steps on both sides: samples in order, constant step, a fixed epoch count
IN_ORDER = dict(shuffle=False, learning_rate="constant", eta0=0.01, max_iter=5, tol=None)
#: hinge and squared error are written the same way in both libraries; a step agrees to
#: the last bits, five epochs of them to about 1e-14 (log loss: 1e-5, see docs/hogwild.md)
EXACT = dict(rtol=1e-9, atol=1e-12)


def _pair(cls_ours, cls_ref, X, y, fit_kw=None, **params):
    fit_kw = fit_kw or {}
    ours = cls_ours(**params).fit(X, y, **fit_kw)
    ref = cls_ref(**params).fit(X, y, **fit_kw)
    return ours, ref


def _assert_same_model(ours, ref, what):
    np.testing.assert_allclose(ours.coef_, ref.coef_, **EXACT, err_msg=f"coef_ {what}")
    np.testing.assert_allclose(ours.intercept_, ref.intercept_, **EXACT,
                               err_msg=f"intercept_ {what}")


# -- float32 --------------------------------------------------------------------------
def _record_problems(monkeypatch):
    """The Problems the estimators build, in a list."""
    made = []
    real = Problem.from_xy.__func__

    def spy(cls, *args, **kw):
        made.append(real(cls, *args, **kw))
        return made[-1]
    monkeypatch.setattr(E.Problem, "from_xy", classmethod(spy))
    return made


@pytest.mark.parametrize("sparse", [False, True])
def test_float32_is_read_in_place_and_fits_as_float64(sparse, monkeypatch):
    """The kernels get the caller's float32 buffer (no float64 copy), and the fit equals
    the one on the same values in float64: a float32 value converts to float64 exactly,
    and the kernels compute in float64."""
    X32 = XB.astype(np.float32)
    X32 = sp.csr_matrix(X32) if sparse else X32
    made = _record_problems(monkeypatch)
    f32 = HogwildClassifier(random_state=0, max_iter=5, tol=None).fit(X32, YB)
    prob = made[-1]
    assert prob.dtype == np.float32
    buf, mine = (X32.data, prob.data) if sparse else (X32, prob.X)
    assert np.shares_memory(mine, buf), "the Problem copied the caller's float32 data"
    f64 = HogwildClassifier(random_state=0, max_iter=5, tol=None).fit(X32.astype(np.float64),
                                                                       YB)
    np.testing.assert_allclose(f32.coef_, f64.coef_, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(f32.intercept_, f64.intercept_, rtol=1e-12, atol=1e-15)
    assert f32.coef_.dtype == np.float64 and f32.predict(X32).dtype == YB.dtype
    # ... and close to the fit on the float64 originals (float32 rounding of the data)
    orig = sp.csr_matrix(XB) if sparse else XB
    ref = HogwildClassifier(random_state=0, max_iter=5, tol=None).fit(orig, YB)
    np.testing.assert_allclose(f32.coef_, ref.coef_, rtol=1e-4, atol=1e-5)


def test_float32_fit_allocates_no_float64_copy():
    """tracemalloc's peak during a fit on 4 MB of float32 data stays far below the 8 MB
    a float64 copy would take (numpy reports its allocations to tracemalloc)."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(20_000, 50)).astype(np.float32)
    y = (X[:, 0] + 0.1 * rng.normal(size=20_000) > 0).astype(int)
    for backend in ("threads", "processes"):
        est = HogwildClassifier(max_iter=2, tol=None, random_state=0, backend=backend)
        est.fit(X[:100], y[:100])                   # compile and import outside the trace
        tracemalloc.start()
        try:
            est.fit(X, y)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < X.nbytes, (f"{backend}: a fit on {X.nbytes} bytes of float32 peaked "
                                 f"at {peak} bytes traced (a float64 copy is {2 * X.nbytes})")


# -- class_weight ----------------------------------------------------------------------
@pytest.mark.parametrize("X, y", [(XB, YB), (XI, YI)], ids=["binary", "multiclass"])
@pytest.mark.parametrize("class_weight", ["balanced", {0: 3.0, 1: 0.5}])
def test_class_weight_matches_sgdclassifier(X, y, class_weight):
    sw = np.random.default_rng(1).uniform(0.5, 2.0, size=len(y))
    ours, ref = _pair(HogwildClassifier, SGDClassifier, X, y, {"sample_weight": sw},
                      class_weight=class_weight, **IN_ORDER)
    _assert_same_model(ours, ref, f"with class_weight={class_weight} and sample_weight")
    plain = HogwildClassifier(**IN_ORDER).fit(X, y, sample_weight=sw)
    assert not np.allclose(plain.coef_, ours.coef_), "class_weight changed nothing"


def test_class_weight_on_processes_equals_threads(no_shm_leak):
    kw = dict(class_weight="balanced", n_workers=1, **IN_ORDER)
    th = HogwildClassifier(**kw).fit(XI, YI)
    pr = HogwildClassifier(backend="processes", **kw).fit(XI, YI)
    np.testing.assert_array_equal(th.coef_, pr.coef_)


# -- warm_start, coef_init ---------------------------------------------------------------
@pytest.mark.parametrize("X, y", [(XB, YB), (XI, YI)], ids=["binary", "multiclass"])
def test_warm_start_and_coef_init_match_sgdclassifier(X, y):
    for average in (False, True):            # with average, the second fit starts from
        ours = HogwildClassifier(warm_start=True, average=average, **IN_ORDER)   # the mean
        ref = SGDClassifier(warm_start=True, average=average, **IN_ORDER)
        for _ in range(2):                   # the second fit starts from the first's weights
            ours.fit(X, y)
            ref.fit(X, y)
        _assert_same_model(ours, ref, f"after two warm-started fits, average={average}")
    cold = HogwildClassifier(average=True, **IN_ORDER).fit(X, y)
    assert not np.allclose(cold.coef_, ours.coef_)
    rng = np.random.default_rng(2)
    c0, b0 = rng.normal(size=ref.coef_.shape), rng.normal(size=ref.intercept_.shape)
    ours = HogwildClassifier(**IN_ORDER).fit(X, y, coef_init=c0, intercept_init=b0)
    ref = SGDClassifier(**IN_ORDER).fit(X, y, coef_init=c0, intercept_init=b0)
    _assert_same_model(ours, ref, "from coef_init / intercept_init")


def test_regressor_warm_start_matches_sgdregressor():
    ours, ref = HogwildRegressor(warm_start=True, **IN_ORDER), SGDRegressor(warm_start=True,
                                                                            **IN_ORDER)
    for _ in range(2):
        ours.fit(XR, YR)
        ref.fit(XR, YR)
    _assert_same_model(ours, ref, "after two warm-started fits")
    c0 = np.linspace(-1, 1, XR.shape[1])
    ours = HogwildRegressor(**IN_ORDER).fit(XR, YR, coef_init=c0, intercept_init=[0.5])
    ref = SGDRegressor(**IN_ORDER).fit(XR, YR, coef_init=c0, intercept_init=[0.5])
    _assert_same_model(ours, ref, "from coef_init / intercept_init")
    ours = HogwildRegressor(**IN_ORDER).fit(XR, YR, intercept_init=0.5)    # a number, too
    ref = SGDRegressor(**IN_ORDER).fit(XR, YR, intercept_init=0.5)
    _assert_same_model(ours, ref, "from a number intercept_init")


# -- average (ASGD) ---------------------------------------------------------------------
@pytest.mark.parametrize("late", [False, True])
@pytest.mark.parametrize("penalty", ["l2", None])
@pytest.mark.parametrize("X, y", [(XB, YB), (XI, YI), (sp.csr_matrix(XI), YI)],
                         ids=["binary", "multiclass", "multiclass-sparse"])
def test_average_matches_sgdclassifier(X, y, late, penalty):
    """average=True and an int a (averaging from the a-th sample seen on, here inside
    the third of the five epochs), as SGD's; sparse rows too, whose intercept steps
    both libraries shrink by 0.01."""
    average = int(2.5 * len(y)) if late else True
    ours, ref = _pair(HogwildClassifier, SGDClassifier, X, y, average=average,
                      penalty=penalty, **IN_ORDER)
    _assert_same_model(ours, ref, f"with average={average}")
    assert not np.allclose(ours.coef_, ours._state.W), "coef_ is not the average"


def test_average_partial_fit_and_regressor_match_sgd():
    ours = HogwildClassifier(average=200, **IN_ORDER)
    ref = SGDClassifier(average=200, **IN_ORDER)
    for k in range(3):                       # the average goes on across the calls
        ours.partial_fit(XI, YI, classes=[0, 1, 2])
        ref.partial_fit(XI, YI, classes=[0, 1, 2])
        _assert_same_model(ours, ref, f"after partial_fit call {k + 1}")
    ours, ref = _pair(HogwildRegressor, SGDRegressor, XR, YR, average=True, **IN_ORDER)
    _assert_same_model(ours, ref, "regressor with average=True")


def _serial_average(X, Y, *, average, epochs, eta, alpha2, alpha1, momentum):
    """The average of the weights after each step from the average-th on, by the serial
    oracle run one sample at a time (dense rows: L1 on every feature)."""
    n, d = X.shape
    W, b, q = np.zeros((Y.shape[1], d)), np.zeros(Y.shape[1]), np.zeros((Y.shape[1], d))
    V = np.zeros_like(W)
    u, sums, count = 0.0, [np.zeros_like(W), np.zeros_like(b)], 0
    for t in range(epochs * n):
        W, b, u = serial_sgd_epoch(X, Y, [t % n], W, b, loss="hinge", eta=lambda _: eta,
                                   alpha2=alpha2, alpha1=alpha1, u=u, q=q, t_start=t,
                                   l1_all_features=True, momentum=momentum, V=V)
        if t + 1 >= average:
            sums[0] += W
            sums[1] += b
            count += 1
    return sums[0] / count, sums[1] / count, W


@pytest.mark.parametrize("penalty, momentum", [("elasticnet", 0.0), ("l1", 0.0),
                                               ("l2", 0.9)])
def test_average_equals_the_serial_oracle_with_l1_and_momentum(penalty, momentum):
    """With L1 clips and momentum the lazy average still equals the plain average of the
    weights after every step (after its clip). scikit-learn's does not here: its lazy
    update leaves the clips out, so they enter its average as if they had been made at
    every earlier step since its last rescale; on this problem the two differ by a few
    percent of the largest weight (checked against a 5% band)."""
    alpha, l1 = 1e-3, {"elasticnet": 0.15, "l1": 1.0, "l2": 0.0}[penalty]
    Y = np.where(YB == 1, 1.0, -1.0)[:, None]
    sgd = HogwildSGD(XB.shape[1], 1, loss="hinge", alpha=alpha, l1_ratio=l1,
                     learning_rate="constant", eta0=0.01, momentum=momentum, shuffle=False,
                     average=300)
    prob = Problem.from_xy(XB, Y)
    for _ in range(2):
        sgd.epoch(prob)
    avg_W, avg_b, W = _serial_average(XB, Y, average=300, epochs=2, eta=0.01,
                                      alpha2=alpha * (1 - l1), alpha1=alpha * l1,
                                      momentum=momentum)
    np.testing.assert_allclose(sgd.W, W, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(sgd.avg_W, avg_W, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(sgd.avg_b, avg_b, rtol=1e-9, atol=1e-12)
    if momentum == 0:
        ref = SGDClassifier(penalty=penalty, alpha=alpha, average=300, shuffle=False,
                            learning_rate="constant", eta0=0.01, max_iter=2, tol=None,
                            l1_ratio=l1).fit(XB, YB)
        gap = np.abs(sgd.avg_W - ref.coef_).max() / np.abs(ref.coef_).max()
        assert gap < 0.05, f"the average is {gap:.3%} of the largest weight off scikit-learn's"


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_average_and_class_weight_on_processes_equal_threads(start_method, no_shm_leak):
    """The average's sums travel in the shared segment, the class weights with the
    data (inherited by fork, shipped to spawned workers)."""
    kw = dict(average=100, class_weight="balanced", **IN_ORDER)
    one = HogwildClassifier(**kw).fit(XI, YI)
    proc = HogwildClassifier(backend="processes", start_method=start_method, **kw).fit(XI, YI)
    np.testing.assert_array_equal(one.coef_, proc.coef_)
    np.testing.assert_array_equal(one.intercept_, proc.intercept_)


def test_average_with_two_workers(no_shm_leak):
    two = HogwildClassifier(average=True, n_workers=2, random_state=0, max_iter=5,
                            tol=None, hot_features=8).fit(sp.csr_matrix(XB), YB)
    assert two.score(XB, YB) > 0.95
    assert two._state.avg_count == 5 * len(YB)
    assert two.hot_features_ == 0, "averaging buffers no hot features"


# -- early_stopping -----------------------------------------------------------------------
def test_early_stopping_matches_sgdclassifier_and_sgdregressor():
    """The same stratified split, the same training steps (the held-out rows skipped),
    the same stopping epoch. penalty=None: scikit-learn scores its unscaled weight
    vector, which equals the weights only while the L2 scale is 1."""
    kw = dict(early_stopping=True, validation_fraction=0.2, n_iter_no_change=3, tol=1e-4,
              random_state=3, penalty=None, shuffle=False, learning_rate="constant",
              eta0=0.01, max_iter=200)
    ours, ref = _pair(HogwildClassifier, SGDClassifier, XB, YB, **kw)
    assert ours.n_iter_ == ref.n_iter_ < 200
    _assert_same_model(ours, ref, "with early_stopping")
    assert len(ours.validation_scores_) == ours.n_iter_
    ours, ref = _pair(HogwildRegressor, SGDRegressor, XR, YR, **kw)
    assert ours.n_iter_ == ref.n_iter_ < 200
    _assert_same_model(ours, ref, "regressor with early_stopping")


def test_early_stopping_holds_out_the_split_and_scores_it():
    """The model equals a plain fit on the training rows alone for as many epochs, and
    its last validation score is its accuracy on the held-out rows; multiclass is one
    split and one rule for all classes (scikit-learn stops each class on its own), so
    against SGDClassifier only the accuracy is compared."""
    from sklearn.model_selection import StratifiedShuffleSplit
    kw = dict(validation_fraction=0.25, random_state=5, **{**IN_ORDER, "tol": 1e-3,
                                                           "max_iter": 100})
    es = HogwildClassifier(early_stopping=True, n_iter_no_change=2, **kw).fit(XI, YI)
    train, val = next(StratifiedShuffleSplit(test_size=0.25, random_state=5).split(XI, YI))
    plain = HogwildClassifier(**{**kw, "max_iter": es.n_iter_, "tol": None}).fit(
        XI[np.sort(train)], YI[np.sort(train)])
    _assert_same_model(es, plain, "early stopping vs a fit on the training rows")
    assert es.validation_scores_[-1] == es.score(XI[val], YI[val])
    ref = SGDClassifier(early_stopping=True, n_iter_no_change=2, **kw).fit(XI, YI)
    assert abs(es.score(XI, YI) - ref.score(XI, YI)) <= 0.05


# -- scikit-learn's checks with the new parameters ------------------------------------------
#: checks that scikit-learn's own SGD estimators fail with the same settings
_PARTIAL_FIT = "calls partial_fit, which refuses class_weight='balanced' and early_stopping " \
               "(as SGDClassifier)"
_NEW_PARAM_FAILURES = {
    "check_sample_weight_equivalence_on_dense_data":
        "SGD: a weight of 2 is not a repeated sample (also xfail for SGDClassifier)",
    "check_sample_weight_equivalence_on_sparse_data":
        "SGD: a weight of 2 is not a repeated sample (also xfail for SGDClassifier)",
    "check_supervised_y_2d": "fits twice and compares: with warm_start=True the second fit "
                             "starts from the first's weights (SGDClassifier alike)",
}
_PF = {"check_fit_score_takes_y": _PARTIAL_FIT,
       "check_n_features_in_after_fitting": _PARTIAL_FIT,
       "check_estimators_partial_fit_n_features": _PARTIAL_FIT}


@pytest.mark.parametrize("est, extra", [
    (HogwildClassifier(class_weight="balanced", warm_start=True, average=True,
                       random_state=0), _PF),
    (HogwildClassifier(loss="log_loss", early_stopping=True, validation_fraction=0.3,
                       average=10, warm_start=True, random_state=0),
     {**_PF, "check_class_weight_classifiers":
      "early stopping on (unweighted) accuracy stops before the check's extreme class "
      "weights take over; SGDClassifier(loss='log_loss', average=10, early_stopping=True) "
      "fails it too"}),
    (HogwildRegressor(early_stopping=True, average=True, warm_start=True, random_state=0),
     _PF),
    (HogwildClassifier(average=5, warm_start=True, backend="processes", random_state=0),
     {}),
], ids=["balanced-warm-average", "early-stopping-average", "regressor", "processes"])
def test_sklearn_checks_with_the_new_parameters(est, extra):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_estimator(est, expected_failed_checks={**_NEW_PARAM_FAILURES, **extra})


# -- bad values -------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, exc, match", [
    ({"class_weight": "bogus"}, ValueError, "class_weight must be None, 'balanced' or a dict"),
    ({"class_weight": [1, 2]}, ValueError, "class_weight must be None"),
    ({"class_weight": {0: -1.0}}, ValueError, r"class_weight\[0\] must be a finite number"),
    ({"class_weight": {7: 1.0}}, ValueError, "class_weight: .*not in class_weight|class_weight:"),
    ({"warm_start": "yes"}, TypeError, "warm_start must be True or False"),
    ({"shuffle": 1}, TypeError, "shuffle must be True or False"),
    ({"early_stopping": None}, TypeError, "early_stopping must be True or False"),
    ({"average": -1}, ValueError, "average must be False, True or an int >= 1"),
    ({"average": 0}, ValueError, "use False for no averaging"),
    ({"average": 1.5}, ValueError, "average must be False, True or an int"),
    ({"validation_fraction": 0.0}, ValueError, "validation_fraction must be > 0"),
    ({"validation_fraction": 1.0}, ValueError, r"validation_fraction must be in \(0, 1\)"),
    ({"validation_fraction": "a"}, TypeError, "validation_fraction must be a number"),
])
def test_bad_new_parameters(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        HogwildClassifier(**kwargs).fit(XI, YI)


def test_bad_uses_of_the_new_parameters():
    with pytest.raises(ValueError, match="coef_init must have shape \\(3, 4\\)"):
        HogwildClassifier().fit(XI, YI, coef_init=np.zeros((2, 4)))
    with pytest.raises(ValueError, match="intercept_init must have shape \\(1,\\)"):
        HogwildRegressor().fit(XR, YR, intercept_init=[1.0, 2.0])
    warm = HogwildClassifier(warm_start=True, max_iter=2, tol=None).fit(XI, YI)
    with pytest.raises(ValueError, match="with warm_start=True, refit on data with the same"):
        warm.fit(XB, YB)                      # other features and classes
    with pytest.raises(ValueError, match="'balanced' is not available in partial_fit"):
        HogwildClassifier(class_weight="balanced").partial_fit(XI, YI, classes=[0, 1, 2])
    with pytest.raises(ValueError, match="early_stopping must be False with partial_fit"):
        HogwildRegressor(early_stopping=True).partial_fit(XR, YR)
    with pytest.raises(ValueError, match="early_stopping: cannot hold out"):
        HogwildClassifier(early_stopping=True).fit(XI[:12], np.arange(12) % 3)
    from sklearn.model_selection import ShuffleSplit
    val = next(ShuffleSplit(test_size=0.5, random_state=0).split(XR[:10]))[1]
    sw = np.ones(10)
    sw[val] = 0.0
    with pytest.raises(ValueError, match="every sample of the validation set has weight 0"):
        HogwildRegressor(early_stopping=True, validation_fraction=0.5, random_state=0).fit(
            XR[:10], YR[:10], sample_weight=sw)
    with pytest.raises(ValueError, match="class_weight must be a finite"):
        Problem.from_xy(XB, np.ones((len(YB), 1)), class_weight=[[1.0]])


# -- plots ------------------------------------------------------------------------------
def _curves():
    return {"bsp": {"seconds": [0.0, 1.0, 2.0], "loss": [0.7, 0.5, 0.4], "updates": [0, 5, 9],
                    "detections": [], "staleness_hist": [3, 1]},
            "saps": {"seconds": [0.0, 1.0], "loss": [0.7, 0.45], "detections": [(0.5, 1)],
                     "events": [(0.5, 1, True), (0.8, 1, False)]}}


def test_plots_return_figures_draw_where_told_and_keep_the_backend(tmp_path):
    import matplotlib
    from matplotlib.figure import Figure

    from sgd_shm.eager.__main__ import plot as plot_eager
    from sgd_shm.ps import plot_losses
    backend = matplotlib.get_backend()
    fig = plot_losses(_curves(), 0.5, n_workers=2)
    assert isinstance(fig, Figure) and len(fig.axes) == 4
    mine = Figure()
    assert plot_losses(_curves(), 0.5, tmp_path / "ps.png", fig=mine) is mine
    assert len(mine.axes) == 4 and (tmp_path / "ps.png").stat().st_size > 0
    held = _curves()
    for c in held.values():                       # runs given eval_set: accuracy on top
        c["val_score"] = [0.5 + 0.1 * i for i in range(len(c["seconds"]))]
    fig = plot_losses(held, 0.6)
    assert fig.axes[0].get_ylabel() == "held-out accuracy"
    assert fig.axes[1].get_ylabel() == "training loss"

    class Run:
        history = [{"seconds": 0.0, "step": 0, "loss": 0.7}, {"seconds": 1.0, "step": 3,
                                                              "loss": 0.4}]
    fig = plot_eager({"sync": [Run()]}, 0.5, tmp_path / "eager.png", "t")
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    assert (tmp_path / "eager.png").stat().st_size > 0
    assert matplotlib.get_backend() == backend
    with pytest.raises(TypeError, match="fig must be a matplotlib.figure.Figure"):
        plot_losses(_curves(), 0.5, fig="nope")


def test_no_plotting_function_of_the_kit_switches_the_backend():
    """The source of the kit's packages never calls matplotlib.use or imports pyplot."""
    import pathlib

    import relaxed
    import sgd_shm
    offenders = []
    for pkg in (sgd_shm, relaxed):
        for path in pathlib.Path(pkg.__file__).parent.rglob("*.py"):
            code = [line for line in path.read_text().splitlines()
                    if not line.lstrip().startswith("#")]       # (examples in comments)
            if any("matplotlib.use(" in line or "import matplotlib.pyplot" in line
                   or "from matplotlib import pyplot" in line for line in code):
                offenders.append(str(path))
    assert not offenders, f"these switch or use pyplot's global state: {offenders}"


def test_new_parameters_keep_the_defaults_of_sgd():
    """The defaults are SGDClassifier's / SGDRegressor's."""
    for ours, ref in ((HogwildClassifier(), SGDClassifier()), (HogwildRegressor(),
                                                               SGDRegressor())):
        for name in ("shuffle", "early_stopping", "validation_fraction", "warm_start",
                     "average", "class_weight"):
            if name in ours.get_params():
                assert ours.get_params()[name] == ref.get_params()[name], name
    assert math.isclose(HogwildClassifier().validation_fraction, 0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        HogwildClassifier(random_state=0).fit(XB, YB)
