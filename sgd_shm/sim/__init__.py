"""Virtual-time runs of the kit's training at 16-1,024 workers, on this one box.

A discrete-event simulator that drives the same parts as the real trainers (the
parameter server's policy objects, the collectives' rules, the compressors with their
error feedback, the models) with real gradients on real data, applied in the order a
cluster would apply them; only time is modelled, by a compute-time model of the
workers and a network model. It answers which policy, collective and compressor pay
at a scale this box cannot run, before renting the cluster (as runtime models do:
Dutta, Joshi, Ghosh, Dube, Nagpurkar, "Slow and stale gradients can win the race",
AISTATS 2018; and simulators of training collectives such as ASTRA-sim, Rashidi et
al., ISPASS 2020, and SimGrid, Casanova et al. 2014).

* :func:`simulate`: one run (parameter server or collective), a :class:`SimResult`
  (a :class:`sgd_shm.core.results.Result`, its history in virtual seconds).
* :class:`Cluster`: compute times (heterogeneous classes, the trainers' straggler
  emulation, traces of real runs); :class:`Network`: latency, bandwidth, topology.
* ``calibrate``, ``Calibration`` (moved to :mod:`sgd_shm.calibrate`): the compute
  model fitted to short real runs on this box. Calibrating runs the real trainers, so
  it sits above them and the simulator, which imports no trainer; the names still
  resolve here, with a DeprecationWarning, until the next release.
* ``simulate(..., replay=result.trace)``: the exact replay of a run traced by
  ``ps.train(..., trace=True)`` or ``eager.train(..., trace=True)``
  (:mod:`sgd_shm.sim.replay`): the simulator makes the run's decisions again.
* :class:`Recorder`: records a real parameter-server run's timeline (a
  :class:`Trace`) through the policy's hooks, for an approximate replay.

Example::

    from sgd_shm.data import make_rcv1_like
    from sgd_shm.sim import Cluster, Network, simulate
    X, y = make_rcv1_like(20_000, 2_000, density=0.02, random_state=0)
    r = simulate(X, y, n_workers=64, collective="majority", epochs=3,
                 cluster=Cluster(2e-3, imbalance=(1, 0.02)), network=Network.gbps(10))
    r.seconds, r.final_loss, r.mean_contributors

See docs/sim.md for the model, its assumptions and its limits.
"""
import importlib
import warnings

from sgd_shm.sim.cluster import TOPOLOGIES, Cluster, Network
from sgd_shm.sim.simulate import SimResult, simulate
from sgd_shm.sim.trace import Recorder, Trace

__all__ = ["simulate", "SimResult", "Cluster", "Network", "Recorder", "Trace",
           "TOPOLOGIES"]

#: names that moved to sgd_shm.calibrate, resolved on use (PEP 562) so that importing
#: the simulator imports no trainer
_MOVED = ("calibrate", "Calibration")


def __getattr__(name):
    if name not in _MOVED:
        raise AttributeError(f"module 'sgd_shm.sim' has no attribute {name!r}")
    warnings.warn("sgd_shm.sim.calibrate/Calibration moved to sgd_shm.calibrate; import "
                  "from there (the sim re-export goes in the next release)",
                  DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module("sgd_shm.calibrate"), name)
