"""The parameter server's parts on their own: policy objects (the built-in ones against
hand-computed answers, and a user-defined policy through train), the result's model,
and the configuration's errors."""
import numpy as np
import pytest

from sgd_shm.data import make_rcv1_like
from sgd_shm.ps import BSP, SSP, Policy, SaPS, train
from sgd_shm.core.policies import make_policy
from sgd_shm.core.status import DEAD, FLAGGED


class FakeLink:
    """What a policy may read of the run: pushes, statuses, epochs, lags."""

    def __init__(self, pushes, status, epochs=None, lags=None):
        self._p, self._s = pushes, status
        self._e = epochs or [0] * len(pushes)
        self._l = lags or [0] * len(pushes)

    def pushes(self, j):
        return self._p[j]

    def status(self, j):
        return self._s[j]

    def epoch(self, p):
        return self._e[p]

    def lag(self, p):
        return self._l[p]


def test_ssp_and_bsp_gates():
    link = FakeLink([5, 3, 9], [0, 0, 0])
    ssp = SSP(staleness=2).bind(3)
    assert ssp.may_step(0, 5, link)                  # slowest has 3 >= 5 - 2
    assert not ssp.may_step(0, 6, link)              # 3 < 6 - 2
    bsp = BSP().bind(3)
    assert bsp.may_step(1, 3, link) and not bsp.may_step(0, 5, link)
    dead = FakeLink([5, 3, 9], [0, DEAD, 0])         # a dead worker is not waited for
    assert bsp.may_step(0, 5, dead)


def test_saps_push_scale_and_sources():
    saps = SaPS(staleness=4).bind(3)
    assert saps.push_scale(4, False) == 1.0
    assert saps.push_scale(8, False) == 0.5          # down-weighted by s / tau
    assert saps.push_scale(8, True) is None          # dropped from a flagged worker
    link = FakeLink([0, 0, 0], [FLAGGED, 0, 0], epochs=[2, 3, 3], lags=[1, 0, 0])
    assert saps.sources(1, link) == [(0, 2)]         # q's epoch + lag <= own; refill below 3-1
    assert saps.sources(0, link) == ()               # a flagged worker steals nothing
    behind = FakeLink([0, 0, 0], [FLAGGED, 0, 0], epochs=[5, 3, 3], lags=[0, 0, 0])
    assert saps.sources(1, behind) == []             # its partition is ahead: leave it


def test_make_policy_errors():
    assert isinstance(make_policy("asp"), Policy) and make_policy("asp").name == "asp"
    mine = SSP(1)
    assert make_policy(mine) is mine
    with pytest.raises(ValueError, match="policy: must be one of"):
        make_policy("fast")
    with pytest.raises(TypeError, match="pass an instance"):
        make_policy(SaPS)
    with pytest.raises(ValueError, match="staleness"):
        SSP(-1).bind(2)
    with pytest.raises(ValueError, match="window"):
        SaPS(window=0)
    # a setting the named policy does not use is ignored with a warning, not silently
    for name in ("asp", "bsp", "rps"):
        with pytest.warns(UserWarning, match=f"staleness: policy '{name}' has no staleness"):
            make_policy(name, staleness=2)
    for name in ("asp", "bsp", "ssp", "rps"):
        with pytest.warns(UserWarning, match=f"window: .* policy '{name}' does not run"):
            make_policy(name, window=1.0)
    # beside a policy object, which carries its own settings, one is refused
    with pytest.raises(ValueError, match=r"carries its own settings.*SSP\(staleness=2\)"):
        make_policy(mine, staleness=2)
    with pytest.raises(ValueError, match=r"carries its own settings.*SaPS\(window=1.0\)"):
        make_policy(mine, window=1.0)
    assert make_policy("ssp", staleness=2).bind(3).s == 2
    saps = make_policy("saps", staleness=2, window=0.25)
    assert saps.bind(3).s == 2 and (saps.window, saps.detect_factor) == (0.25, 2.0)


class DropStale(Policy):
    """A user's policy: asynchronous, but a push staler than 2 updates is dropped."""
    name = "drop-stale"
    uses_staleness = True

    def push_scale(self, tau, flagged):
        return None if tau > 2 else 1.0


class CountSamples(Policy):
    """A user's policy that counts the coordinator's samples (the hook runs in the
    coordinator's process, on the bound copy)."""
    name = "count-samples"
    samples = 0

    def on_sample(self, view):
        type(self).samples += 1
        assert 0 <= view.now and view.flagged == set()


@pytest.fixture(scope="module")
def data():
    return make_rcv1_like(3000, 300, random_state=0)


def test_user_defined_policies_run(data, no_shm_leak):
    X, y = data
    r = train(X, y, n_workers=3, policy=DropStale(), max_seconds=0.8, seed=0, progress=False)
    assert r.policy == "drop-stale"
    dropped = sum(w["dropped"] for w in r.workers)
    assert dropped > 0                                # 3 workers on 2 cores: stale pushes
    assert sum(w["pushes"] for w in r.workers) == r.updates and r.batches["lost"] == 0
    assert np.sum(r.staleness_hist) == r.updates     # the histogram counts applied pushes
    CountSamples.samples = 0
    c = train(X, y, n_workers=2, policy=CountSamples(), max_seconds=0.5, seed=0,
              progress=False)
    assert CountSamples.samples == len(c.history) - 1   # every sample but the final one


def test_result_is_a_model(data, no_shm_leak):
    X, y = data
    yl = np.where(y > 0, "spam", "ham")
    r = train(X[:2500], yl[:2500], n_workers=2, policy="asp", max_seconds=0.8, seed=0,
              progress=False)
    assert list(r.classes_) == ["ham", "spam"] and r.coef_.shape == (X.shape[1],)
    np.testing.assert_allclose(r.decision_function(X[2500:]), X[2500:] @ r.coef_)
    assert set(r.predict(X[2500:])) <= {"ham", "spam"}
    majority = max(np.mean(yl[2500:] == "ham"), np.mean(yl[2500:] == "spam"))
    assert r.score(X[2500:], yl[2500:]) > majority
    with pytest.raises(ValueError, match="features"):
        r.predict(X[:, :10])


def test_configuration_errors(data):
    X, y = data
    with pytest.raises(TypeError, match="unexpected keyword"):
        train(X, y, n_worker=2)
    with pytest.raises(ValueError, match="backend"):
        train(X, y, backend="mpi")
    with pytest.raises(ValueError, match="address"):
        train(X, y, address="ray://head:10001")


def test_scikit_learn_classifier(data, no_shm_leak):
    """ParameterServerClassifier: fit/predict/score on held-out rows, clone and
    get_params as scikit-learn expects, a pipeline, clear errors."""
    from sklearn.base import clone
    from sklearn.exceptions import NotFittedError
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import MaxAbsScaler
    from sgd_shm.ps import ParameterServerClassifier
    X, y = data
    clf = ParameterServerClassifier(n_workers=2, policy="asp", max_seconds=0.6,
                                    random_state=0)
    with pytest.raises(NotFittedError):
        clf.predict(X)
    assert clone(clf).get_params() == clf.get_params()
    clf.fit(X[:2500], y[:2500])
    majority = max(np.mean(y[2500:] > 0), np.mean(y[2500:] < 0))
    assert clf.score(X[2500:], y[2500:]) > majority
    assert clf.coef_.shape == (1, X.shape[1]) and clf.n_features_in_ == X.shape[1]
    assert clf.result_.batches["lost"] == 0
    # n_iter_: the passes made (2 partitions of 1,250 rows, 20 minibatches of 64 each),
    # fewer than max_iter where the time limit stopped the run (it was max_iter always)
    assert clf.n_iter_ == sum(clf.result_.batches["applied"]) // 40 <= clf.max_iter
    short = ParameterServerClassifier(n_workers=2, policy="asp", max_iter=10_000,
                                      max_seconds=0.3, random_state=0).fit(X[:2500], y[:2500])
    assert short.n_iter_ == sum(short.result_.batches["applied"]) // 40 < 10_000
    with pytest.raises(ValueError, match="features"):
        clf.predict(X[:, :10])
    pipe = make_pipeline(MaxAbsScaler(), clone(clf)).fit(X[:2500], y[:2500])
    assert pipe.score(X[2500:], y[2500:]) > majority
    with pytest.raises(ValueError, match="policy"):
        ParameterServerClassifier(policy="fast").fit(X, y)


def test_slowdown_specs_and_their_errors():
    """Every form of ``slowdown=`` gives the per-worker factors, and a bad one is refused
    naming slowdown (a non-number factor used to surface as numpy's bare message)."""
    from sgd_shm.core.imbalance import factors_of
    assert factors_of(None, 3).tolist() == [1.0, 1.0, 1.0]
    assert factors_of("straggler", 3).tolist() == [4.0, 1.0, 1.0]
    assert factors_of({2: 3.0}, 3).tolist() == [1.0, 1.0, 3.0]
    assert factors_of([1, 2, 3], 3).tolist() == [1.0, 2.0, 3.0]
    for bad, words in [({0: "x"}, "a factor must be a number"), (["a", "b", "c"], "expected a"),
                       ("fast", "profile must be one of"), ({5: 2.0}, "worker 5 is not an int in"),
                       ([1, 2], "expected 3 factors"), ({0: 0.5}, "factors must be finite and >= 1"),
                       # a bool is no worker (True indexed every one); a string or complex
                       # factor is no number (float() or numpy took them)
                       ({True: 4.0}, "worker True is not an int"), ({0: "4"}, "a factor must"),
                       (["1", "2", "3"], "expected a"), ([1 + 0j, 1, 1], "expected a"),
                       ([True] * 3, "expected a")]:
        with pytest.raises(ValueError, match=f"slowdown: {words}"):
            factors_of(bad, 3)
