"""The Ray transport: the same parameter server on a Ray cluster (one box or several).

* One actor per shard (:class:`_Shard`) holds its slice of the weights and its
  version counter; a push applies the worker's gradient slice there. A sparse push
  (a compressed gradient) sends each shard actor its indices hit only the (indices,
  values) run that falls in its slice, and leaves the other shards alone.
* A hub actor (:class:`_Hub`) holds what the shared segment holds on one box: the
  global version, the per-worker slots and staleness histograms, the stop flag, and
  the partitions' minibatch queues with their epoch counters, lags and the
  exactly-once tally. An actor runs one call at a time, so its counters and its
  queue refills are atomic without locks.
* Workers are actors (:class:`_Worker`) running the same loop as the processes of the
  shared-memory transport (:func:`sgd_shm.ps.worker.run_worker`) through a
  :class:`RayLink`. The data and the job travel once, through Ray's object store
  (numpy arrays are shared zero-copy by the workers of a node).
* The coordinator (the caller's process) reads shard versions and worker counters
  through actor calls; ``ray.kill`` of a worker actor is the fault injection.
* Model averaging (RPS): the shard actors are the servers. A worker sends its block
  j of round r to shard j (``deposit``, waited for) unless the message is lost, then
  counts the deposit at the hub; after the round's barrier it asks each shard for
  its average of round r (``average``, or ``finish`` where the answer is lost, so
  the server still completes the round), which the shard computes once, from the
  blocks it holds in worker order, on the first such call. Message counts go to the
  hub (fire and forget).

Ray is an optional extra (``pip install 'relaxed-sgd-kit[ray]'``): this module is
imported only by ``train(..., backend="ray")``. With ``address=None`` a local Ray
instance sized to the machine is started (or the running one is used); with an
address, that cluster is joined.

Differences from shared memory, by design: a push reads no shard locks (each shard
actor applies one update at a time), so ``wait`` has no effect; a dead worker's
partial push stays applied on the shards it reached, as on shared memory.
"""
from __future__ import annotations

import heapq

import numpy as np
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from sgd_shm.ps.partitions import tally, written_off_lag
from sgd_shm.ps.policies import server_average
from sgd_shm.ps.store import DEAD, HIST_BINS, SLOT_FIELDS, SLOT_INDEX as _SLOT, staleness_bin
from sgd_shm.ps.worker import MESSAGE_FIELDS, Diverged, run_worker, warm


def _gather(shards):
    """(weights, shard versions) from the shard actors, read in parallel."""
    parts = ray.get([s.pull.remote() for s in shards])
    return np.concatenate([w for w, _ in parts]), np.array([v for _, v in parts], np.int64)


def ensure_ray(address=None):
    """Connect to Ray: the running instance, the cluster at ``address``, or a new local
    instance sized to the machine."""
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=True,
                 configure_logging=False)


@ray.remote(num_cpus=0)
class _Shard:
    def reset(self, w, version):
        self.w = np.array(w, dtype=np.float64)
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
    """Global version, slots, histograms, stop flag and minibatch queues."""

    def reset(self, n_workers, n_batches, seed, version=0, pushes=None, epochs=None,
              budget=None, n_params=0, n_shards=1):
        self.n, self.nb = n_workers, np.asarray(n_batches, np.int64)
        self.boff = np.concatenate([[0], np.cumsum(self.nb)])
        self.rng = np.random.default_rng(seed)
        self.version = int(version)
        self.slots = np.zeros((n_workers, len(SLOT_FIELDS)), np.int64)
        self.applied_weight = np.zeros(n_workers)
        self.hist = np.zeros((n_workers, HIST_BINS), np.int64)
        self.epochs = np.zeros(n_workers, np.int64)
        if pushes is not None:
            self.slots[:, _SLOT["pushes"]] = pushes
            self.epochs[:] = epochs
        self.epoch0 = self.epochs.copy()
        self.lags = np.zeros(n_workers, np.int64)
        self.queues = [[] for _ in range(n_workers)]
        self.taken = np.zeros((n_workers, int(self.boff[-1])), np.int64)
        self.stop = False
        self.budget, self.claimed, self.n_params = budget, 0, int(n_params)
        self.msgs = np.zeros((n_workers, n_shards, len(MESSAGE_FIELDS)), np.int64)

    # ---- workers ---------------------------------------------------------------------
    def view(self):
        """(stop, pushes, statuses, epochs, lags): a worker's once-per-step read."""
        return (self.stop, self.slots[:, _SLOT["pushes"]].copy(),
                self.slots[:, _SLOT["status"]].copy(), self.epochs.copy(), self.lags.copy())

    def get_version(self):
        return self.version

    def pulled(self, k):
        self.slots[k, _SLOT["pulled_version"]] = self.version
        return self.version

    def pushed(self, k, pulled_version, scale, nbytes=None):
        stale = self.version - pulled_version
        s = self.slots[k]
        s[_SLOT["pushes"]] += 1
        s[_SLOT["bytes_sent"]] += 8 * self.n_params if nbytes is None else int(nbytes)
        s[_SLOT["bytes_dense"]] += 8 * self.n_params
        s[_SLOT["staleness_sum"]] += max(stale, 0)
        self.hist[k, staleness_bin(stale)] += 1
        self.applied_weight[k] += scale
        self.version += 1

    def add(self, k, field, n):
        self.slots[k, _SLOT[field]] += n

    def deposited(self, k):
        """RPS: worker k sent its round (one push of staleness 0, every block sent);
        the version is the rounds every live worker has sent."""
        s = self.slots[k]
        s[_SLOT["pushes"]] += 1
        s[_SLOT["bytes_sent"]] += 8 * self.n_params
        s[_SLOT["bytes_dense"]] += 8 * self.n_params
        self.hist[k, 0] += 1
        self.applied_weight[k] += 1.0
        live = self.slots[:, _SLOT["status"]] != DEAD
        if live.any():
            self.version = max(self.version, int(self.slots[live, _SLOT["pushes"]].min()))

    def add_messages(self, k, counts):
        self.msgs[k] += counts

    def messages(self):
        return self.msgs.copy()

    def take(self, p, limit):
        q = self.queues[p]
        if not q:
            e = int(self.epochs[p])
            if limit is not None and e >= limit:
                return None
            self.epochs[p] = e + 1
            n = int(self.nb[p])
            keys = (e + 1) * n + self.rng.permutation(n)
            for j in range(n):
                heapq.heappush(q, (int(keys[j]), j))
        return heapq.heappop(q)

    def requeue(self, p, key, j):
        heapq.heappush(self.queues[p], (key, j))

    def claim(self):
        """A ticket of the work budget (see :mod:`sgd_shm.ps.partitions`)."""
        if self.budget is None:
            return True
        self.claimed += 1
        return self.claimed <= self.budget

    def budget_done(self, n_killed=0):
        if self.budget is None:
            return False
        applied = int(self.taken.sum())
        return applied >= self.budget or (n_killed > 0 and self.claimed >= self.budget
                                          and applied >= self.budget - n_killed)

    def applied(self, k, p, j):
        self.taken[k, self.boff[p] + j] += 1

    # ---- coordinator -----------------------------------------------------------------
    def counters(self):
        s = self.slots
        return (s[:, _SLOT["staleness_sum"]].copy(),
                s[:, _SLOT["pushes"]] + s[:, _SLOT["dropped"]])

    def set_status(self, k, status):
        self.slots[k, _SLOT["status"]] = status

    def write_off(self, q, unflagged_live):
        lag = written_off_lag(self.epochs, q, unflagged_live)
        if lag is not None:
            self.lags[q] = lag

    def set_stop(self):
        self.stop = True

    def state(self):
        """(version, pushes, epochs) for a checkpoint."""
        return self.version, self.slots[:, _SLOT["pushes"]].copy(), self.epochs.copy()

    def report(self):
        workers = []
        for k in range(self.n):
            d = {f: int(self.slots[k, i]) for i, f in enumerate(SLOT_FIELDS)}
            d["applied_weight"] = float(self.applied_weight[k])
            workers.append(d)
        queued = [np.bincount([j for _, j in self.queues[p]], minlength=int(self.nb[p]))
                  for p in range(self.n)]
        batches = tally(self.taken, queued, self.epochs, self.epoch0, self.nb, self.boff)
        return workers, self.hist.tolist(), batches


class RayLink:
    """A worker's view of the run on Ray (see :mod:`sgd_shm.ps.worker`). The hub's
    counters are read once per step, when the loop asks whether to stop, and cached
    for the policy's questions of that step."""

    poll_s = 0.002                   # a look at the gate is an actor call

    def __init__(self, hub, shards, bounds, lr):
        self.hub, self.shards, self.bounds, self.lr = hub, shards, bounds, lr
        self._view = ray.get(hub.view.remote())

    def messages(self, k, counts):
        self.hub.add_messages.remote(k, counts)        # fire and forget, in order

    def deposit(self, k, r, x, up):
        b = self.bounds
        ray.get([self.shards[j].deposit.remote(r, k, x[b[j]:b[j + 1]].copy())
                 for j in np.flatnonzero(up)])
        self.hub.deposited.remote(k)                   # ordered before k's next view

    def collect(self, k, r, x, down):
        b = self.bounds
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

    def stopped(self):
        self._view = ray.get(self.hub.view.remote())
        return self._view[0]

    def coordinator_alive(self):
        return True                      # Ray ends a job's actors with its driver

    def pull(self, k):
        v = ray.get(self.hub.pulled.remote(k))
        return _gather(self.shards)[0], v

    def push(self, k, g, v, scale, nbytes=None, shards=None):
        step = self.lr * scale
        b = self.bounds
        to = range(len(self.shards)) if shards is None else shards
        ray.get([self.shards[i].apply.remote(g[b[i]:b[i + 1]], step) for i in to])
        ray.get(self.hub.pushed.remote(k, v, scale, nbytes))

    def push_sparse(self, k, idx, vals, v, scale, nbytes):
        """Send each shard actor hit by ``idx`` (ascending) its run of (offsets,
        values); the others get nothing. One push for the hub, as a dense one."""
        step = self.lr * scale
        b = self.bounds
        idx = np.asarray(idx)
        vals = np.asarray(vals, dtype=np.float64)
        cuts = np.searchsorted(idx, b)
        ray.get([self.shards[i].apply_sparse.remote(idx[cuts[i]:cuts[i + 1]] - b[i],
                                                     vals[cuts[i]:cuts[i + 1]], step)
                 for i in np.flatnonzero(cuts[1:] > cuts[:-1])])
        ray.get(self.hub.pushed.remote(k, v, scale, nbytes))

    def claim(self):
        return ray.get(self.hub.claim.remote())

    def version(self):
        return ray.get(self.hub.get_version.remote())

    def pushes(self, j):
        return int(self._view[1][j])

    def status(self, j):
        return int(self._view[2][j])

    def add(self, k, field, n):
        self.hub.add.remote(k, field, n)            # ordered after this worker's earlier calls

    def epoch(self, p):
        return int(self._view[3][p])

    def lag(self, p):
        return int(self._view[4][p])

    def take(self, p, rng, limit):
        return ray.get(self.hub.take.remote(p, limit))

    def requeue(self, p, key, j):
        self.hub.requeue.remote(p, key, j)

    def applied(self, k, p, j):
        self.hub.applied.remote(k, p, j)


@ray.remote(num_cpus=0)
class _Worker:
    def warm(self, job):
        """Import and compile (or load from Numba's cache) the gradient kernel (and the
        compressor's) before the clock starts; returns this actor's node id."""
        if job.model.uses_blas:                  # one BLAS thread per worker actor
            from sgd_shm.models import one_blas_thread
            one_blas_thread()
        warm(job)
        if job.compressor is not None:
            job.compressor.memory(job.n_params, np.float64).step(
                np.random.default_rng(0).standard_normal(job.n_params))
        return ray.get_runtime_context().get_node_id()

    def run(self, hub, shards, bounds, lr, job, k, seed):
        link = RayLink(hub, shards, bounds, lr)
        try:
            run_worker(link, job, k, seed)
        except Diverged:
            return "diverged"
        ray.get(hub.get_version.remote())           # the fire-and-forget calls have landed
        return "stopped"


class _Pool:
    """Idle actors of this Ray session, reused by the next run (an actor is a process,
    whose start costs more than a short run)."""

    def __init__(self):
        self.session, self.idle = None, {}

    def _check_session(self):
        node = ray.get_runtime_context().get_node_id()
        gcs = ray.get_runtime_context().gcs_address
        if self.session != (node, gcs):
            self.session, self.idle = (node, gcs), {}

    def take(self, cls, n, node=None):
        """n actors of ``cls`` (placed on ``node`` when given), idle ones first."""
        self._check_session()
        idle = self.idle.setdefault((cls, node), [])
        out = [idle.pop() for _ in range(min(n, len(idle)))]
        opts = {}
        if node is not None:
            opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=False)
        return out + [cls.options(**opts).remote() for _ in range(n - len(out))]

    def give(self, cls, actor, node=None):
        self.idle.setdefault((cls, node), []).append(actor)


def _alive_nodes():
    """The ids of the cluster's live nodes, in a fixed order."""
    return sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])


_POOL = _Pool()


class RayBackend:
    """Coordinator side of the Ray transport."""

    name = "ray"

    def __init__(self, n_params, n_shards, n_workers, batches, rng, ckpt=None, address=None,
                 budget=None, replicas=False, lossy=False, init=None):
        ensure_ray(address)
        self.n_workers = n_workers
        self.bounds = np.linspace(0, n_params, n_shards + 1).astype(np.int64)
        w = (np.zeros(n_params) if init is None else np.asarray(init, np.float64)) \
            if ckpt is None else ckpt["weights"]
        vers = np.zeros(n_shards, np.int64) if ckpt is None else ckpt["shard_versions"]
        self.shards = _POOL.take(_Shard, n_shards)
        self.hub = _POOL.take(_Hub, 1)[0]
        self.workers, self.runs, self._seen, self.nodes, self._killed = [], [], set(), [], set()
        self.lossy = lossy
        restore = ckpt is not None and len(ckpt["pushes"]) == n_workers
        ray.get([s.reset.remote(w[self.bounds[i]:self.bounds[i + 1]], int(vers[i]))
                 for i, s in enumerate(self.shards)]
                + [self.hub.reset.remote(n_workers, batches.n_batches, int(rng.integers(2**31)),
                                         version=0 if ckpt is None else ckpt["version"],
                                         pushes=ckpt["pushes"] if restore else None,
                                         epochs=ckpt["epochs"] if restore else None,
                                         budget=budget, n_params=n_params,
                                         n_shards=n_shards)])

    def start(self, job, seeds, lr, wait):
        job_ref = ray.put(job)
        nodes = _alive_nodes()                       # worker k on node k mod #nodes
        self.placed = [nodes[k % len(nodes)] for k in range(self.n_workers)]
        self.workers = [_POOL.take(_Worker, 1, node)[0] for node in self.placed]
        self.nodes = ray.get([w.warm.remote(job_ref) for w in self.workers])
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
        ray.get(self.hub.set_stop.remote())
        if self.runs:
            done, _ = ray.wait(self.runs, num_returns=len(self.runs), timeout=30)
            self._killed |= {k for k, r in enumerate(self.runs) if r not in done}

    def pull(self):
        v = ray.get(self.hub.get_version.remote())
        return _gather(self.shards)[0], v

    def version(self):
        return ray.get(self.hub.get_version.remote())

    def counters(self):
        """(staleness sums, pushes tried: applied + dropped) of every worker."""
        return ray.get(self.hub.counters.remote())

    def set_status(self, k, status):
        ray.get(self.hub.set_status.remote(k, status))

    def budget_done(self, n_killed=0):
        """True once the work budget is spent (see ``ShmBackend.budget_done``)."""
        return ray.get(self.hub.budget_done.remote(n_killed))

    def write_off(self, q, unflagged_live):
        ray.get(self.hub.write_off.remote(q, unflagged_live))

    def snapshot(self):
        v, pushes, epochs = ray.get(self.hub.state.remote())
        w, vers = _gather(self.shards)
        return w, vers, v, pushes, epochs

    def report(self):
        return ray.get(self.hub.report.remote())

    def messages(self):
        """(n_workers, n_shards, 4) message counts, or None without message loss."""
        return ray.get(self.hub.messages.remote()) if self.lossy else None

    def close(self):
        """Idle actors go back to the pool for the next run; a killed or stuck worker
        is killed for good."""
        for k, a in enumerate(self.workers):
            if k in self._killed:
                ray.kill(a, no_restart=True)
            else:
                _POOL.give(_Worker, a, self.placed[k])
        for a in self.shards:
            _POOL.give(_Shard, a)
        if self.hub is not None:
            _POOL.give(_Hub, self.hub)
        self.workers, self.shards, self.hub = [], [], None


def _outcome(ref):
    try:
        res = ray.get(ref)
    except ray.exceptions.RayActorError:           # ActorDiedError after ray.kill
        return "killed"
    except ray.exceptions.RayTaskError as e:
        return f"failed: {e}"
    return res                                     # "diverged" or "stopped"
