"""The Ray transport with node-local shared memory: on each node, that node's worker
actors share one replica of the server's state through the shared-memory transport,
and one agent per node exchanges the replica's changes with the global shard actors.

A worker's step is then the shared-memory worker's step (no actor call): it talks to
a :class:`NodeLink`, the :class:`~sgd_shm.ps.shm_backend.ShmLink` over its node's
:class:`~sgd_shm.ps.shm_backend.LocalState`, which the node's agent (:class:`_Agent`)
created and owns. Cross-node traffic is per node, not per worker.

**A sync** (every ``sync_every`` seconds, by the agent's thread; one round trip to
every shard actor and the root, all in flight together):

1. The node's counts are read first: its workers' pushes, and how many pushes it
   applied to each shard (the shard versions less the remote ones it merged).
2. The replica is copied (an asynchronous read, as a pull is). For each shard, the
   entries that differ from ``base`` (the node's copy of the global values it last
   sent or received) go up, as values: sparse (int32 offsets and values of the
   weights' float type) where that is smaller, else the whole shard; ``base`` takes
   them.
3. Shard actor j (:class:`_Shard`) keeps the global slice ``w`` and, per node, the
   mirror of that node's ``base``. Values from node n replace ``w`` where ``w``
   still equals ``base[n]`` (no other node changed that entry since: the value is
   taken bit for bit) and add their change ``values - base[n]`` elsewhere. It
   answers with the entries where ``w`` differs from ``base[n]`` (the other nodes'
   changes), as values again, and with the pushes the other nodes applied to it.
4. The node merges each answer under the shard's lock (``w_local += values -
   base``, then ``base = values``: updates its workers made meanwhile stay), then
   raises its shard versions and its global version by the other nodes' pushes.

Every update is sent exactly once: what a node sent leaves ``w_local - base``, what
it has not sent stays in it. With one node, ``w`` always equals ``base[0]``, so the
global weights are the replica's, bit for bit.

**Counts and the gates.** Each node's report of its workers' pushes travels with its
values, to every shard, tagged with the sync's number; a node takes another node's
counts from the shard that holds the oldest of them, so every push it counts has
its values merged (they were read before the values were copied). The remote pushes
raise the node's global version after the merge, so a push's staleness counts the
other nodes' pushes it missed. The root actor (:class:`_Root`) carries what the
coordinator writes (statuses, the stop flag) to the nodes and the nodes' reports
(counters, epochs, budget progress) to the coordinator, each one sync late: the pushes
a report counts have their values on every server, so the version the coordinator
reads before the weights is never ahead of them.

**Staleness across the two levels.** Within a node, everything is as on shared
memory. Across nodes, a worker sees another node's pushes (their counts and their
values together) up to two syncs late, never early. So the gates keep their
guarantees and only grow more conservative: BSP never starts round c before every
live worker's c-1 pushes are in its weights, and SSP never lets a worker run more
than s pushes ahead of the slowest (a remote count read low only closes the gate).
A push's measured staleness counts the remote pushes merged between its pull and
its push; SaPS's bound and detection read it.

**Data and budgets.** Worker k keeps its partition (as on every transport); a worker
takes minibatches only from its node's partitions (SaPS steals from a flagged worker
of its own node; under ``partition="blocks"`` the partition drawn each step is one of
the node's), so every minibatch is still applied at most once per epoch. A work
budget (``epochs=``) is split among the nodes by their partitions' minibatches.

**Faults.** A killed worker actor is reported as on shared memory (its node's
survivors take over a shard lock it held). A killed agent or shard actor ends the
run with a :class:`NodeError` naming it within a few syncs; a dead agent's segments
are unlinked by the coordinator through a live worker of its node (Ray kills an actor
with its children, its resource tracker among them).
"""
from __future__ import annotations

import os
import threading
import time
import uuid

import numpy as np
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from relaxed.shm import live_segment_names, unlink_orphan
from sgd_shm.core.launcher import Shipment, pid_alive
from sgd_shm.core.status import written_off_lag
from sgd_shm.ps.ray_backend import _outcome, release, warm_actor, warmed_nodes
from sgd_shm.ps.shm_backend import LocalState, ShmLink, warm_up
from sgd_shm.ps.worker import Diverged, run_worker

#: seconds a sync's calls may take before the agent gives up on them
SYNC_TIMEOUT = 20.0
#: seconds between a node's syncs, by default: one node (the global level only
#: mirrors it, for the coordinator's samples), several nodes
SYNC_EVERY = (0.02, 0.005)
#: the names of the run's agents and servers start with it
NAME_PREFIX = "sgd_shm.ps "
#: seconds the worker actors have to start (placed, imported, kernels loaded)
READY_TIMEOUT = 120.0


class NodeError(RuntimeError):
    """A node agent or a global shard actor died (or a sync failed): the run cannot
    go on, since that node's or shard's unsent updates are lost."""


def _wire(n_changed, n, itemsize=8):
    """Bytes of a sparse message (int32 offsets, values of ``itemsize`` bytes: 8 in
    float64, 4 in float32) vs a dense one."""
    return (4 + itemsize) * n_changed, itemsize * n


# ---- the global level ------------------------------------------------------------------

@ray.remote(num_cpus=0)
class _Server:
    """A global server: the slice of the weights of a run of the store's shards, per
    node the mirror of that node's ``base`` over it, the pushes each node applied to
    each of its shards, and the nodes' latest counts."""

    def reset(self, w, versions, n_nodes):
        self.w = np.array(w, copy=True)      # the run's float type (the backend's dtype)
        self.base = [self.w.copy() for _ in range(n_nodes)]
        self.versions = np.array(versions, np.int64)
        self.applied = np.zeros((n_nodes, len(self.versions)), np.int64)
        self.seen = np.zeros_like(self.applied)      # remote pushes each node was told of
        self.counts = [(-1, None)] * n_nodes           # (sync number, report)

    def sync(self, n, seq, up, pushes, counts):
        """Node n's sync: its values ``up`` ((offsets or None, values), or None), the
        pushes it applied to each shard here and its counts; returns (the other
        nodes' changes as (offsets or None, values), per shard the remote pushes it
        has not been told of, every node's counts as held here)."""
        b = self.base[n]
        if up is not None:
            off, vals = up
            if off is None:
                self.w = np.where(self.w == b, vals, self.w + (vals - b))
                b[:] = vals
            else:
                cur, old = self.w[off], b[off]
                self.w[off] = np.where(cur == old, vals, cur + (vals - old))
                b[off] = vals
        self.applied[n] += pushes
        self.versions += pushes
        self.counts[n] = (int(seq), counts)
        ch = np.flatnonzero(self.w != b)
        sparse, dense = _wire(ch.size, b.size, b.itemsize)
        if sparse < dense:
            down = (ch.astype(np.int32), self.w[ch])
            b[ch] = down[1]
        else:
            down = (None, self.w.copy())
            b[:] = self.w
        remote = self.applied.sum(axis=0) - self.applied[n] - self.seen[n]
        self.seen[n] += remote
        return down, remote, self.counts

    def pull(self):
        return self.w, self.versions


@ray.remote(num_cpus=0)
class _Root:
    """The run's global bookkeeping: statuses and the stop flag (written by the
    coordinator, read by every sync), the nodes' latest reports (read by the
    coordinator)."""

    def reset(self, n_workers, owners, version0, budgets):
        self.status = np.zeros(n_workers, np.int64)
        self.stopped = False
        self.owners = [list(ks) for ks in owners]       # node -> its workers
        self.version0 = int(version0)
        self.budgets = budgets
        self.reports = [None] * len(owners)

    def sync(self, n, report):
        """Node n's report (None: none yet); returns the statuses and the stop flag."""
        if report is not None:
            self.reports[n] = report
        return self.status.copy(), self.stopped

    def set_status(self, k, s):
        self.status[int(k)] = int(s)

    def stop(self):
        self.stopped = True

    def _per_worker(self, field):
        out = np.zeros(len(self.status), np.int64)
        for n, rep in enumerate(self.reports):
            if rep is not None:
                out[self.owners[n]] = rep[field]
        return out

    def counters(self):
        """(staleness sums, pushes tried: applied + dropped) of every worker."""
        return (self._per_worker("staleness"),
                self._per_worker("pushes") + self._per_worker("dropped"))

    def version(self):
        return self.version0 + sum(r["own"] for r in self.reports if r is not None)

    def pushes(self):
        return self._per_worker("pushes")

    def epochs(self):
        """Every partition's epoch, from its owner node's report."""
        return self._per_worker("epochs")

    def budget_done(self, killed):
        """Every node has spent its budget (``killed``: per node, workers killed; one
        ticket each may be lost, see ``ServerState.budget_done``)."""
        for n, rep in enumerate(self.reports):
            b = self.budgets[n]
            if rep is None:
                return False
            if rep["applied"] >= b:
                continue
            if not (killed[n] > 0 and rep["tickets"] >= b and rep["applied"] >= b - killed[n]):
                return False
        return True


# ---- a node ------------------------------------------------------------------------------

class NodeLink(ShmLink):
    """A worker's link on its node's replica: the shared-memory link, whose
    coordinator is the node's agent, taking minibatches only from the node's own
    partitions."""

    def __init__(self, server, lr, wait, agent_pid, local):
        super().__init__(server, lr, wait, agent_pid)
        self.local = frozenset(int(p) for p in local)

    def coordinator_alive(self):
        return pid_alive(self.parent)

    def take(self, k, sources, rng, claim):
        mine = [s for s in sources[:-1] if s[0] in self.local]
        last = sources[-1]                 # k's own, or under blocks a drawn partition
        mine.append(last if last[0] in self.local else (k, None))
        return self.server.take(k, mine, claim, rng)


@ray.remote(num_cpus=0, max_concurrency=4)
class _Agent:
    """A node's agent: owns the node's :class:`LocalState` (shared memory), syncs it
    with the global level (see the module notes) and reports to the root."""

    def open(self, n, spec, workers, budget, lr, wait):
        """Create the node's state; returns the workers' link as a :class:`Shipment`'s
        bytes, and the names of the node's segments (unlinked by the coordinator
        through a worker of the node if this agent dies: Ray kills an actor with its
        children, the resource tracker among them). ``spec``: the run's (n_params,
        n_shards, n_workers, batches, seeds, ckpt, init, clock, dtype)."""
        n_params, n_shards, n_workers, batches, seeds, ckpt, init, clock, dtype = spec
        warm_up(None, n_params, dtype)
        self.n, self.local = int(n), np.asarray(workers, np.int64)   # k trains partition k
        self.state = LocalState(n_params, n_shards, n_workers, batches, seeds, ckpt,
                                budget, init=init, clock=clock, dtype=dtype)
        st = self.state.store
        self.base, self.bounds = st.weights.copy(), st.bounds
        self.pushes0, self.sent_own = st.all_pushes(), st.shard_versions()
        self.remote_added = np.zeros(n_shards, np.int64)
        self.remote_seen = 0                          # remote pushes counted in the version
        self.seq, self.last_report = 0, None
        self.traffic = {"syncs": 0, "bytes_up": 0, "bytes_down": 0}
        self.error, self.thread = None, None
        self.halt, self.ended, self.lock = threading.Event(), threading.Event(), threading.Lock()
        self.shipment = Shipment(NodeLink(self.state.server, lr, wait, os.getpid(), self.local))
        return self.shipment.blob, live_segment_names()

    def start(self, root, servers, groups, others, sync_every):
        """Start syncing every ``sync_every`` seconds with ``servers`` (server i holds
        the store's shards ``groups[i]:groups[i + 1]``); ``others``: {node: its
        workers} of the other nodes."""
        self.root, self.servers, self.groups = root, servers, np.asarray(groups)
        self.others = {int(m): np.asarray(ks, np.int64) for m, ks in others.items()}
        self.sync_every = float(sync_every)
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self):
        try:
            while not self.halt.is_set():
                t = time.perf_counter()
                with self.lock:
                    self._sync()
                self.halt.wait(max(0.0, self.sync_every - (time.perf_counter() - t)))
        except BaseException as e:                    # a server or the root died
            self.error = f"{type(e).__name__}: {e}"
            self.state.server.stop()                  # the node's workers end
        finally:
            self.ended.set()

    def done(self):
        """Returns once syncing ended: None after :meth:`finish`, else the error."""
        self.ended.wait()
        return self.error

    def _report(self, pushes):
        st, parts = self.state.store, self.state.parts
        ks = self.local.tolist()
        return {"pushes": pushes, "own": int((pushes - self.pushes0[self.local]).sum()),
                "staleness": np.array([st.counter(k, "staleness_sum") for k in ks]),
                "dropped": np.array([st.counter(k, "dropped") for k in ks]),
                "epochs": parts.all_epochs()[self.local], "applied": parts.applied_total(),
                "tickets": int(parts.tickets[0])}

    def _span(self, i):
        return int(self.bounds[self.groups[i]]), int(self.bounds[self.groups[i + 1]])

    def _uplink(self, cur, i):
        """Server i's part of a sync's values: the entries that changed since ``base``."""
        lo, hi = self._span(i)
        ch = np.flatnonzero(cur[lo:hi] != self.base[lo:hi])
        if ch.size == 0:
            return None
        sparse, dense = _wire(ch.size, hi - lo, cur.itemsize)
        if sparse < dense:
            up = (ch.astype(np.int32), cur[lo + ch])
            self.base[lo + ch] = up[1]
        else:
            up = (None, cur[lo:hi])
            self.base[lo:hi] = up[1]
        self.traffic["bytes_up"] += min(sparse, dense)
        return up

    def _merge(self, i, down):
        """Server i's answer into the replica, shard by shard under its lock."""
        lo, hi = self._span(i)
        off, vals = down
        if off is None:
            delta = vals - self.base[lo:hi]
            self.base[lo:hi] = vals
            off = np.arange(hi - lo)
            self.traffic["bytes_down"] += _wire(0, hi - lo, vals.itemsize)[1]
        else:
            if not off.size:
                return
            off = off.astype(np.int64)
            delta = vals - self.base[lo + off]
            self.base[lo + off] = vals
            self.traffic["bytes_down"] += _wire(off.size, 0, vals.itemsize)[0]
        st, b = self.state.store, self.bounds
        cuts = np.searchsorted(lo + off, b[self.groups[i]:self.groups[i + 1] + 1])
        for t, s in enumerate(range(self.groups[i], self.groups[i + 1])):
            a, z = cuts[t], cuts[t + 1]
            if z > a:
                whole = z - a == b[s + 1] - b[s]
                st.add_at(s, None if whole else lo + off[a:z] - b[s], delta[a:z])

    def _sync(self):
        """One sync (see the module notes)."""
        st = self.state.store
        self.seq += 1
        own = st.shard_versions() - self.remote_added   # counts before the values
        d_own, self.sent_own = own - self.sent_own, own
        pushes = st.all_pushes()[self.local]
        cur = st.weights.copy()
        g = self.groups
        refs = [sv.sync.remote(self.n, self.seq, self._uplink(cur, i), d_own[g[i]:g[i + 1]],
                               pushes)
                for i, sv in enumerate(self.servers)]
        # the root gets the previous sync's report, whose values every server holds, so
        # the version the coordinator reads before the weights is never ahead of them
        refs.append(self.root.sync.remote(self.n, self.last_report))
        report = self._report(pushes)
        got = ray.get(refs, timeout=SYNC_TIMEOUT)
        self.last_report = report
        remote = np.zeros(len(self.remote_added), np.int64)
        for i, (down, r, _) in enumerate(got[:-1]):
            self._merge(i, down)
            remote[g[i]:g[i + 1]] = r
        self.remote_added += remote
        counted = self._remote_counts([c for _, _, c in got[:-1]])
        st.bump(remote, counted - self.remote_seen)
        self.remote_seen = counted
        status, stopped = got[-1]
        for k in np.flatnonzero(status != st.all_status()).tolist():
            st.record(k, status=int(status[k]))
        if stopped:
            self.state.server.stop()
        self.traffic["syncs"] += 1

    def _remote_counts(self, held):
        """Mirror the other nodes' counts, each from the server holding its oldest
        (every push counted there has its values merged here); returns their pushes
        since the start."""
        total = 0
        for m, ks in self.others.items():
            _, rep = min((h[m] for h in held), key=lambda c: c[0])
            if rep is not None:
                self.state.store.mirror(ks, rep)
                total += int((np.asarray(rep) - self.pushes0[ks]).sum())
        return total

    def set_lag(self, q, lag):
        self.state.parts.set_lag(q, lag)

    def finish(self):
        """After the node's workers ended: stop syncing, send what is left, and
        return the node's report (its workers' slots and histograms, the
        exactly-once tally of its partitions, its traffic)."""
        self.halt.set()
        if self.thread is not None:
            self.thread.join()
        if self.error is not None:
            raise NodeError(f"node {self.n}: {self.error}")
        with self.lock:
            self._sync()                              # everything left, to the servers
            ray.get(self.root.sync.remote(self.n, self.last_report), timeout=SYNC_TIMEOUT)
        workers, hist, check = self.state.report()  # dead locks freed, invariants checked
        ks = self.local.tolist()
        return {"workers": {k: workers[k] for k in ks}, "hist": {k: hist[k] for k in ks},
                "check": check, "traffic": dict(self.traffic)}

    def close(self):
        """Unlink the node's segments (the workers keep their mappings until they
        exit)."""
        if getattr(self, "shipment", None) is not None:
            self.shipment.close()
            self.shipment = None
        if getattr(self, "state", None) is not None:
            self.state.close()
            self.state = None


@ray.remote
class _NodeWorker:
    def warm(self, job):
        return warm_actor(job)

    def unlink(self, names):
        """Unlink the segments of this node's dead agent."""
        for name in names:
            unlink_orphan(name)

    def run(self, blob, job, k, seed):
        link = Shipment.land(blob)
        try:
            run_worker(link, job, k, seed)
        except Diverged:
            return "diverged"
        return "stopped"


# ---- the coordinator's side ---------------------------------------------------------------

def _name(role, i):
    """A unique actor name, ``sgd_shm.ps <role> <i> <random>``: the run's agents and
    servers can be found by name (``ray.util.list_named_actors``) to watch or kill."""
    return f"{NAME_PREFIX}{role} {i} {uuid.uuid4().hex[:8]}"


def _node_budgets(budget, owners, batches):
    """The work budget split among the nodes by their partitions' minibatches (the
    last node takes the rounding)."""
    if budget is None:
        return [None] * len(owners)
    nb = batches.n_batches
    total = int(nb.sum())
    out = [int(budget) * int(nb[ks].sum()) // total for ks in owners]
    out[-1] += int(budget) - sum(out)
    return out


class NodeLocalBackend:
    """Coordinator side of the Ray transport with node-local shared memory (see the
    module notes). ``worker_cpus``: the CPUs each worker actor declares;
    ``sync_every``: seconds between a node's syncs (None: :data:`SYNC_EVERY`)."""

    name = "ray"

    def __init__(self, n_params, n_shards, n_workers, batches, rng, ckpt=None, budget=None,
                 init=None, session=None, owned=False, sync_every=None, clock="exact",
                 dtype=np.float64):
        self.n_params, self.n_shards, self.n_workers = n_params, n_shards, n_workers
        self.dtype = np.dtype(dtype)              # the weights' float type, everywhere
        self.batches, self.ckpt, self.budget, self.init = batches, ckpt, budget, init
        self.session, self.owned, self.sync_every = session, owned, sync_every
        self.clock = clock                        # each node's store's version clock
        self.worker_cpus = session.worker_cpus
        session.check_fits(n_workers)
        self.seeds = [int(rng.integers(2**31)) for _ in range(n_workers)]  # as on shm
        self.bounds = np.linspace(0, n_params, n_shards + 1).astype(np.int64)
        self.workers, self.agents, self.servers, self.runs, self.dones = [], [], [], [], []
        self.nodes, self.reports, self._seen, self._dead = [], None, set(), set()
        self.segments = []
        self.root, self._stopping, self._failed = None, False, False

    # ---- start -------------------------------------------------------------------------
    def _place(self, job_ref):
        """Worker actors where Ray puts them (spread over the nodes); their nodes."""
        key = ("ps-worker", self.worker_cpus)
        self.workers = [self.session.take(key) or _NodeWorker.options(
            num_cpus=self.worker_cpus, scheduling_strategy="SPREAD").remote()
            for _ in range(self.n_workers)]
        try:
            self.nodes = warmed_nodes(ray.get([w.warm.remote(job_ref) for w in self.workers],
                                              timeout=READY_TIMEOUT))
        except ray.exceptions.GetTimeoutError:
            raise RuntimeError(
                f"Ray did not start {self.n_workers} worker actors of {self.worker_cpus:g} "
                f"CPUs each within {READY_TIMEOUT:g} s: the cluster's free CPUs are taken "
                "(by other actors or tasks); free them or pass a RaySession with a smaller "
                "worker_cpus") from None
        ids = list(dict.fromkeys(self.nodes))
        self.owners = [[k for k in range(self.n_workers) if self.nodes[k] == i] for i in ids]
        self.node_of = {k: n for n, ks in enumerate(self.owners) for k in ks}
        return ids

    def _open_nodes(self, ids, lr, wait):
        spec = ray.put((self.n_params, self.n_shards, self.n_workers, self.batches,
                        self.seeds, self.ckpt, self.init, self.clock, self.dtype))
        budgets = _node_budgets(self.budget, self.owners, self.batches)
        self.agents = [self.session.take(("ps-agent", i)) or _Agent.options(
            name=_name("agent", n), scheduling_strategy=NodeAffinitySchedulingStrategy(
                i, soft=False)).remote() for n, i in enumerate(ids)]
        self.agent_nodes = ids
        opened = ray.get([a.open.remote(n, spec, self.owners[n], budgets[n], lr, wait)
                          for n, a in enumerate(self.agents)])
        self.segments = [names for _, names in opened]
        return [blob for blob, _ in opened], budgets

    def _open_servers(self, n_nodes, budgets):
        ck = self.ckpt
        w = np.asarray(np.zeros(self.n_params) if self.init is None else self.init,
                       self.dtype) if ck is None else np.asarray(ck["weights"], self.dtype)
        vers = np.zeros(self.n_shards, np.int64) if ck is None else ck["shard_versions"]
        m = max(1, min(self.n_shards, n_nodes))
        self.groups = np.linspace(0, self.n_shards, m + 1).astype(np.int64)
        b, g = self.bounds, self.groups
        self.servers = [self.session.take("ps-server") or
                        _Server.options(name=_name("server", i)).remote() for i in range(m)]
        self.root = self.session.take("ps-root") or _Root.remote()
        ray.get([s.reset.remote(w[b[g[i]]:b[g[i + 1]]], vers[g[i]:g[i + 1]], n_nodes)
                 for i, s in enumerate(self.servers)]
                + [self.root.reset.remote(self.n_workers, self.owners,
                                          0 if ck is None else ck["version"],
                                          [0 if x is None else x for x in budgets])])

    def start(self, job, seeds, lr, wait):
        warm_up(job.compressor, job.n_params, job.dtype)   # Numba's cache, before the actors
        job_ref = ray.put(job)
        ids = self._place(job_ref)
        blobs, budgets = self._open_nodes(ids, lr, wait)
        self._open_servers(len(ids), budgets)
        every = self.sync_every or SYNC_EVERY[len(ids) > 1]
        ray.get([a.start.remote(self.root, self.servers, self.groups,
                                {m: ks for m, ks in enumerate(self.owners) if m != n}, every)
                 for n, a in enumerate(self.agents)])
        self.dones = [a.done.remote() for a in self.agents]
        self.runs = [w.run.remote(blobs[self.node_of[k]], job_ref, k, int(seeds[k]))
                     for k, w in enumerate(self.workers)]

    # ---- watch, stop -----------------------------------------------------------------------
    def kill(self, k):
        ray.kill(self.workers[k], no_restart=True)
        return True

    def _check_nodes(self):
        """Raise :class:`NodeError` when a node's agent died or its sync failed."""
        ended, _ = ray.wait(self.dones, num_returns=len(self.dones), timeout=0)
        for n, ref in enumerate(self.dones):
            if ref in ended:
                try:
                    err = ray.get(ref)
                except ray.exceptions.RayActorError as e:
                    err = f"its agent died ({type(e).__name__})"
                self._failed = True
                raise NodeError(f"Ray node {n} ({self.agent_nodes[n]}, workers "
                                f"{self.owners[n]}): {err}; the run cannot go on without "
                                "its updates")

    def poll(self):
        if not self._stopping:
            self._check_nodes()
        out = {}
        todo = [(k, r) for k, r in enumerate(self.runs) if k not in self._seen]
        if not todo:
            return out
        ended, _ = ray.wait([r for _, r in todo], num_returns=len(todo), timeout=0)
        for k, r in todo:
            if r in ended:
                self._seen.add(k)
                how = _outcome(r)
                if how == "killed":
                    self._dead.add(k)
                if how != "stopped":
                    out[k] = how
        return out

    def stop(self):
        """Stop the workers, then each node's last sync and report."""
        self._stopping = True
        if self.root is None:
            return
        try:
            ray.get(self.root.stop.remote(), timeout=SYNC_TIMEOUT)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            self._failed = True              # the agents' syncs fail: their nodes stop
        if self.runs:
            done, _ = ray.wait(self.runs, num_returns=len(self.runs), timeout=30)
            self._dead |= {k for k, r in enumerate(self.runs) if r not in done}
        if self.agents and self.reports is None and not self._failed:
            try:
                self.reports = ray.get([a.finish.remote() for a in self.agents], timeout=60)
            except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError,
                    ray.exceptions.GetTimeoutError) as e:
                self._failed = True
                raise NodeError(f"Ray node: an agent died or its last sync failed before "
                                f"the run's end ({type(e).__name__}): {e}") from None

    # ---- reads and writes --------------------------------------------------------------
    def _get(self, refs):
        """``ray.get``; a dead global server, root or agent is a :class:`NodeError`."""
        try:
            return ray.get(refs, timeout=SYNC_TIMEOUT)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as e:
            self._failed = True
            raise NodeError(f"Ray node: a global server, the root or a node agent of the "
                            f"run died or stopped answering ({type(e).__name__}); the run "
                            "cannot go on without its state") from e

    def _weights(self):
        parts = self._get([s.pull.remote() for s in self.servers])
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    def pull(self):
        v = self._get(self.root.version.remote())          # read before the weights
        return self._weights()[0], v

    def version(self):
        return self._get(self.root.version.remote())

    def counters(self):
        return self._get(self.root.counters.remote())

    def set_status(self, k, status):
        self._get(self.root.set_status.remote(k, status))

    def budget_done(self, n_killed=0):
        killed = [sum(k in self._dead for k in ks) for ks in self.owners]
        return self._get(self.root.budget_done.remote(killed))

    def write_off(self, q, unflagged_live):
        lag = written_off_lag(self._get(self.root.epochs.remote()), q, unflagged_live)
        if lag is not None:
            self._get(self.agents[self.node_of[q]].set_lag.remote(q, lag))

    def snapshot(self):
        v = self._get(self.root.version.remote())
        w, vers = self._weights()
        return (w, vers, v, self._get(self.root.pushes.remote()),
                self._get(self.root.epochs.remote()))

    def report(self):
        """Every node's report merged: each worker's slot and histogram, each
        partition's tally, from its node."""
        n = self.n_workers
        workers, hist = [None] * n, [None] * n
        batches = {"epochs": [0] * n, "applied": [0] * n, "stolen_by_worker": [0] * n,
                   "queued_at_end": [0] * n, "lost": 0}
        for ks, rep in zip(self.owners, self.reports):
            for k in ks:
                workers[k], hist[k] = rep["workers"][k], rep["hist"][k]
                for f in ("epochs", "applied", "stolen_by_worker", "queued_at_end"):
                    batches[f][k] = rep["check"][f][k]
            batches["lost"] += rep["check"]["lost"]
        return workers, hist, batches

    def traffic(self):
        """Per node: its workers, syncs and the bytes it sent to and received from the
        global servers."""
        return [{"node": self.nodes[ks[0]], "workers": ks, **rep["traffic"]}
                for ks, rep in zip(self.owners, self.reports or [])]

    def messages(self):
        return None

    def _orphans(self, n):
        """Node n's agent died: unlink its segments through a live worker of the node
        (or here, on the node this process runs on)."""
        names = self.segments[n] if n < len(self.segments) else []
        for k in self.owners[n]:
            if k in self._dead:
                continue
            try:
                ray.get(self.workers[k].unlink.remote(names), timeout=10)
                return
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                continue
        if self.agent_nodes[n] == ray.get_runtime_context().get_node_id():
            for name in names:
                unlink_orphan(name)

    def close(self):
        """Unlink every node's segments; the run's actors go back to a caller's
        :class:`~sgd_shm.ps.ray_session.RaySession` for its next run (a killed or
        stuck one is killed for good), or end with the run's own session."""
        idle, gone = [], []
        for n, a in enumerate(self.agents):
            try:
                ray.get(a.close.remote(), timeout=10)
                idle.append((("ps-agent", self.agent_nodes[n]), a))
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                gone.append(a)
                self._orphans(n)
        for k, w in enumerate(self.workers):
            if k in self._dead or self.reports is None:
                gone.append(w)
            else:
                idle.append((("ps-worker", self.worker_cpus), w))
        idle += [("ps-server", s) for s in self.servers]
        if self.root is not None:
            idle.append(("ps-root", self.root))
        if self.reports is None:                     # the run failed: start afresh
            gone += [a for _, a in idle]
            idle = []
        release(self.session, self.owned, idle, gone)
        self.workers, self.agents, self.servers, self.root = [], [], [], None
