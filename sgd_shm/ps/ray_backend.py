"""The Ray transport's direct form: workers that call the server's actors, for model
averaging (``policy="rps"``) and lossy links (``drop=``), whose servers take each
worker's messages (every other run on Ray uses node-local shared memory,
:mod:`sgd_shm.ps.ray_local`).

* One actor per shard (:class:`_Shard`) holds its slice of the weights and its
  version counter; a push applies the worker's gradient slice there. A sparse push
  (a compressed gradient) sends each shard actor its indices hit only the (indices,
  values) run that falls in its slice, and leaves the other shards alone.
* A hub actor (:class:`_Hub`) hosts the run's server state, the same
  :class:`sgd_shm.ps.server.ServerState` that the shared segment holds on one box
  (in private memory here): the global version, the per-worker slots and staleness
  histograms (its :class:`~sgd_shm.ps.store.ParameterStore` counts the pushes the
  shard actors applied, :meth:`~sgd_shm.ps.store.ParameterStore.account`), the stop
  flag, and the partitions' minibatch queues with their epoch counters, lags,
  tickets and the exactly-once tally. An actor runs one call at a time, so each
  verb is atomic. A queue refill needs the worker's random numbers: the hub answers
  a :class:`~sgd_shm.ps.transport.Refill` and the worker asks again with the new
  epoch's order (:meth:`RayLink.take`), so a run draws the same numbers as on
  shared memory.
* Workers are actors (:class:`_Worker`, declaring the session's ``worker_cpus``,
  placed by Ray) running the same loop as the processes of the shared-memory
  transport (:func:`sgd_shm.ps.worker.run_worker`) through a :class:`RayLink`. The
  data and the job travel once, through Ray's object store (numpy arrays are shared
  zero-copy by the workers of a node).
* The coordinator (the caller's process) reads shard versions and worker counters
  through actor calls; ``ray.kill`` of a worker actor is the fault injection.
* Model averaging (RPS): the shard actors are the servers. A worker sends its block
  j of round r to shard j (``deposit``, waited for) unless the message is lost, then
  counts the deposit at the hub; after the round's barrier it asks each shard for
  its average of round r (``average``, or ``finish`` where the answer is lost, so
  the server still completes the round), which the shard computes once, from the
  blocks it holds in worker order, on the first such call. Message counts go to the
  hub (fire and forget).

The connection and the actors' lifetime are the session's
(:class:`sgd_shm.ps.ray_session.RaySession`): a caller's session gets the idle actors
back for its next run; the run's own session ends them. A push reads no shard locks
(each shard actor applies one update at a time), so ``train`` rejects ``wait=`` here;
a dead worker's partial push stays applied on the shards it reached, as on shared
memory.
"""
from __future__ import annotations

import os

import numpy as np
import ray

from sgd_shm.core.policies import server_average
from sgd_shm.core.schedules import make_schedule
from sgd_shm.ps.ray_session import warn_if_niced
from sgd_shm.ps.server import ServerState
from sgd_shm.ps.shm_backend import warm_up
from sgd_shm.ps.transport import Refill
from sgd_shm.ps.worker import Diverged, run_worker, warm


def _gather(shards):
    """(weights, shard versions) from the shard actors, read in parallel."""
    parts = ray.get([s.pull.remote() for s in shards])
    return np.concatenate([w for w, _ in parts]), np.array([v for _, v in parts], np.int64)


@ray.remote(num_cpus=0)
class _Shard:
    def reset(self, w, version):
        self.w = np.array(w, copy=True)      # the run's float type (the backend's dtype)
        self.version = int(version)
        self.inbox = {}              # RPS: round -> {worker: block}
        self.done, self.had = -1, False

    def deposit(self, r, k, block):
        """RPS: worker k's block of round r arrived."""
        self.inbox.setdefault(int(r), {})[int(k)] = block

    def _complete(self, r):
        """Average round r once (every deposit of it is in: the barrier has passed)."""
        if r > self.done:
            got = self.inbox.pop(r, {})
            avg = server_average([got[i] for i in sorted(got)])
            if avg is not None:
                self.w = avg
            self.had, self.done, self.version = avg is not None, r, r + 1
            self.inbox = {q: b for q, b in self.inbox.items() if q > r}

    def average(self, r):
        """RPS: the average of round r, or None when no block of it arrived."""
        self._complete(int(r))
        return self.w if self.had else None

    def finish(self, r):
        """RPS, an answer that is lost: complete round r; whether there was one."""
        self._complete(int(r))
        return self.had

    def pull(self):
        return self.w, self.version

    def apply(self, g, step):
        self.w -= step * g
        self.version += 1

    def apply_sparse(self, idx, vals, step):
        """w[idx] -= step * vals (idx: distinct offsets into this shard)."""
        self.w[idx] -= step * vals
        self.version += 1

    def ping(self):
        return True


@ray.remote(num_cpus=0)
class _Hub:
    """Hosts the run's :class:`ServerState` (private memory, one call at a time): the
    workers' verbs and the coordinator's reads are calls of it."""

    def reset(self, n_params, n_shards, n_workers, batches, seeds, budget=None, lossy=False,
              resume=None, clock="exact", dtype=np.float64):
        """A fresh state (``seeds``: the partitions' queue seeds; ``resume``: a
        checkpoint's versions, pushes and epochs, without its weights; ``dtype``: the
        weights' float type, which the bytes of a dense push count)."""
        if getattr(self, "server", None) is not None:
            self.server.close()
        self.server = ServerState.private(n_params, n_shards, n_workers, batches, seeds,
                                          budget, lossy, clock=clock, dtype=dtype)
        if resume is not None:
            self.server.resume(resume, weights=False)

    def call(self, verb, *args):
        """One of the state's methods (the coordinator's reads and writes)."""
        return getattr(self.server, verb)(*args)

    # ---- the workers' verbs ------------------------------------------------------------
    def view(self):
        return self.server.snapshot_state()

    def get_version(self):
        """The exact global version (the coordinator's; workers read the store's
        clock through :meth:`view`)."""
        return self.server.store.exact_version

    def pulled(self, k):
        return self.server.store.pulled(k)

    def pushed(self, k, version, scale, nbytes, skipped):
        self.server.store.account(k, version, scale=scale, nbytes=nbytes, skipped=skipped)

    def take(self, k, sources, claim, refill=None):
        return self.server.take(k, sources, claim, None, refill)

    def report(self, k, counts, applied, requeue, messages):
        self.server.report(k, counts, applied, requeue, messages)

    def deposited(self, k):
        """RPS: worker k sent its round; the version is the rounds every live worker
        has sent."""
        st = self.server.store
        self.server.round_sent(k, st.dense_bytes, advance=True)


class RayLink:
    """A worker's link on Ray (:class:`sgd_shm.ps.transport.Link`): weights to and
    from the shard actors, everything else one call of the hub's state. ``dtype``:
    the weights' float type (what the values of a sparse push travel as)."""

    poll_s = 0.002                   # a look at the gate is an actor call

    def __init__(self, hub, shards, bounds, lr, dtype=np.float64):
        self.hub, self.shards, self.bounds = hub, shards, bounds
        self.lr = make_schedule(lr)                  # a number or a schedule of t
        self.dtype = np.dtype(dtype)

    def state(self, k):
        return ray.get(self.hub.view.remote())

    def exchange(self, k, push=None, pull=True):
        if push is not None:
            skipped = self._sparse(push) if push.sparse else self._dense(push)
            ray.get(self.hub.pushed.remote(k, push.version, push.scale, push.nbytes,
                                           skipped))
        if not pull:
            return None
        v = ray.get(self.hub.pulled.remote(k))
        return _gather(self.shards)[0], v

    def _dense(self, push):
        """Each shard actor (of ``push.shards``) applies its slice; True when some
        shard was skipped."""
        step, b, g = self.lr(push.version) * push.scale, self.bounds, push.grad
        to = range(len(self.shards)) if push.shards is None else push.shards
        ray.get([self.shards[i].apply.remote(g[b[i]:b[i + 1]], step) for i in to])
        return len(to) < len(self.shards)

    def _sparse(self, push):
        """Send each shard actor hit by the (ascending) indices its run of (offsets,
        values); the others get nothing. True when some shard was not hit."""
        step, b = self.lr(push.version) * push.scale, self.bounds
        idx = np.asarray(push.indices)
        vals = np.asarray(push.values, dtype=self.dtype)
        cuts = np.searchsorted(idx, b)
        hit = np.flatnonzero(cuts[1:] > cuts[:-1])
        ray.get([self.shards[i].apply_sparse.remote(idx[cuts[i]:cuts[i + 1]] - b[i],
                                                     vals[cuts[i]:cuts[i + 1]], step)
                 for i in hit])
        return len(hit) < len(self.shards)

    def take(self, k, sources, rng, claim):
        got = ray.get(self.hub.take.remote(k, sources, claim))
        while isinstance(got, Refill):           # the new epoch's order, from k's numbers
            got = ray.get(self.hub.take.remote(k, sources, False,
                                               (got.p, got.e, rng.permutation(got.n))))
        return got

    def report(self, k, counts=None, *, applied=None, requeue=None, messages=None):
        # fire and forget: ordered before this worker's later calls to the hub
        self.hub.report.remote(k, counts, applied, requeue, messages)

    def average_round(self, k, r, x, up, down, barrier):
        """The blocks to the shard actors (waited for), the round counted at the hub,
        the barrier, then each server's average (``finish`` where the answer is lost,
        so the server still completes the round)."""
        b = self.bounds
        ray.get([self.shards[j].deposit.remote(r, k, x[b[j]:b[j + 1]].copy())
                 for j in np.flatnonzero(up)])
        self.hub.deposited.remote(k)                   # ordered before k's next view
        if not barrier():
            return None
        refs = [(s.average if down[j] else s.finish).remote(r)
                for j, s in enumerate(self.shards)]
        answered = np.zeros(len(self.shards), bool)
        for j, got in enumerate(ray.get(refs)):
            if down[j]:
                answered[j] = got is not None
                if got is not None:
                    x[b[j]:b[j + 1]] = got
            else:
                answered[j] = bool(got)
        return answered


def warm_actor(job):
    """In a worker actor, before the clock starts: one BLAS thread (where the model
    uses BLAS), the store's, the compressor's and the gradient's kernels compiled (or
    loaded from Numba's cache); returns this actor's (node id, niceness)."""
    if job.model.uses_blas:
        from sgd_shm.models import one_blas_thread
        one_blas_thread()
    warm_up(job.compressor, job.n_params, job.dtype)
    warm(job)
    return ray.get_runtime_context().get_node_id(), os.nice(0)


def warmed_nodes(warmed) -> list:
    """The node ids of :func:`warm_actor`'s answers, after warning if the actors are
    niced (:func:`~sgd_shm.ps.ray_session.warn_if_niced`)."""
    warn_if_niced([nice for _, nice in warmed])
    return [node for node, _ in warmed]


@ray.remote
class _Worker:
    def warm(self, job):
        return warm_actor(job)

    def run(self, hub, shards, bounds, lr, job, k, seed):
        link = RayLink(hub, shards, bounds, lr, job.dtype)
        try:
            run_worker(link, job, k, seed)
        except Diverged:
            return "diverged"
        ray.get(hub.get_version.remote())           # the fire-and-forget calls have landed
        return "stopped"


class RayBackend:
    """Coordinator side of the Ray transport."""

    name = "ray"

    def __init__(self, n_params, n_shards, n_workers, batches, rng, ckpt=None, budget=None,
                 replicas=False, lossy=False, init=None, session=None, owned=False,
                 clock="exact", dtype=np.float64):
        self.session, self.owned = session, owned
        session.check_fits(n_workers)
        self.n_workers = n_workers
        self.bounds = np.linspace(0, n_params, n_shards + 1).astype(np.int64)
        w = np.asarray(np.zeros(n_params) if init is None else init, dtype) \
            if ckpt is None else np.asarray(ckpt["weights"], dtype)
        vers = np.zeros(n_shards, np.int64) if ckpt is None else ckpt["shard_versions"]
        self.shards = [session.take("direct-shard") or _Shard.remote() for _ in range(n_shards)]
        self.hub = session.take("direct-hub") or _Hub.remote()
        self.workers, self.runs, self._seen, self.nodes, self._killed = [], [], set(), [], set()
        seeds = [int(rng.integers(2**31)) for _ in range(n_workers)]   # as on shared memory
        resume = None if ckpt is None else {f: ckpt[f] for f in (
            "version", "shard_versions", "pushes", "epochs")}
        ray.get([s.reset.remote(w[self.bounds[i]:self.bounds[i + 1]], int(vers[i]))
                 for i, s in enumerate(self.shards)]
                + [self.hub.reset.remote(n_params, n_shards, n_workers, batches, seeds,
                                         budget, lossy, resume, clock, dtype)])

    def start(self, job, seeds, lr, wait):
        job_ref = ray.put(job)
        cpus = self.session.worker_cpus
        self.workers = [self.session.take(("direct-worker", cpus)) or _Worker.options(
            num_cpus=cpus, scheduling_strategy="SPREAD").remote()
            for _ in range(self.n_workers)]
        self.nodes = warmed_nodes(ray.get([w.warm.remote(job_ref) for w in self.workers]))
        self.runs = [w.run.remote(self.hub, self.shards, self.bounds, lr, job_ref, k,
                                  int(seeds[k])) for k, w in enumerate(self.workers)]

    def kill(self, k):
        ray.kill(self.workers[k], no_restart=True)
        self._killed.add(k)
        return True

    def poll(self):
        out = {}
        done, _ = ray.wait([r for k, r in enumerate(self.runs) if k not in self._seen],
                           num_returns=len(self.runs) - len(self._seen), timeout=0)
        for k, r in enumerate(self.runs):
            if r in done and k not in self._seen:
                self._seen.add(k)
                how = _outcome(r)
                if how != "stopped":
                    out[k] = how
        return out

    def stop(self):
        ray.get(self.hub.call.remote("stop"))
        if self.runs:
            done, _ = ray.wait(self.runs, num_returns=len(self.runs), timeout=30)
            self._killed |= {k for k, r in enumerate(self.runs) if r not in done}

    def pull(self):
        v = ray.get(self.hub.get_version.remote())
        return _gather(self.shards)[0], v

    def version(self):
        return ray.get(self.hub.get_version.remote())

    def _call(self, verb, *args):
        return ray.get(self.hub.call.remote(verb, *args))

    def counters(self):
        """(staleness sums, pushes tried: applied + dropped) of every worker."""
        return self._call("counters")

    def set_status(self, k, status):
        self._call("set_status", k, status)

    def budget_done(self, n_killed=0):
        """True once the work budget is spent (see ``ServerState.budget_done``)."""
        return self._call("budget_done", n_killed)

    def write_off(self, q, unflagged_live):
        self._call("write_off", q, unflagged_live)

    def snapshot(self):
        v, pushes, epochs = self._call("checkpoint_state")
        w, vers = _gather(self.shards)
        return w, vers, v, pushes, epochs

    def report(self):
        return self._call("report_end")

    def messages(self):
        """(n_workers, n_shards, 4) message counts, or None without message loss."""
        return self._call("messages")

    def close(self):
        """Idle actors go back to a caller's :class:`~sgd_shm.ps.ray_session.RaySession`
        for its next run (a killed or stuck worker is killed for good), or end with
        the run's own session."""
        cpus = self.session.worker_cpus
        idle = [(("direct-worker", cpus), a) for k, a in enumerate(self.workers)
                if k not in self._killed]
        idle += [("direct-shard", a) for a in self.shards]
        idle += [] if self.hub is None else [("direct-hub", self.hub)]
        release(self.session, self.owned, idle, [self.workers[k] for k in self._killed])
        self.workers, self.shards, self.hub = [], [], None


def release(session, owned, idle, gone):
    """The end of a run's actors: ``gone`` ones are killed; ``idle`` ones ((key,
    actor)) go back to a caller's session for its next run, or are killed with the
    run's own session (``owned``), which then closes."""
    for a in gone:
        ray.kill(a, no_restart=True)
    for key, a in idle:
        if owned:
            ray.kill(a, no_restart=True)
        else:
            session.keep(key, a)
    if owned:
        session.close()


def _outcome(ref):
    try:
        res = ray.get(ref)
    except ray.exceptions.RayActorError:           # ActorDiedError after ray.kill
        return "killed"
    except ray.exceptions.RayTaskError as e:
        return f"failed: {e}"
    return res                                     # "diverged" or "stopped"
