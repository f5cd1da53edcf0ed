"""Exact replays of traced real runs: ``simulate(..., replay=result.trace)``.

A traced run (``ps.train(..., trace=True)``, ``eager.train(..., trace=True)``) records,
for every call that read or changed the run's shared state, ``time.perf_counter()``
just before and just after it: a *bracket* that holds the instant of the call's
atomic operation. It also records what each read saw (the versions a pull and a
staleness check read, the flag a worker saw, the counters the coordinator read) and
where each write landed (the version a push was applied at).

The real instants are unknown, but they satisfy every order those observations
imply: a read that saw version v came after the push that made v and before the one
that made v + 1; a worker's calls follow one another; a counter read that counted n
of worker k's pushes came after the n-th and before the (n + 1)-th; a worker that
saw itself flagged looked after the coordinator's write. The replay places each
event at the *earliest* time that is at least its bracket's start and after every
event it must follow (the least solution of these difference constraints, found in
one pass over them in topological order). Since the real instants are one solution
inside the brackets, the least one is too, whenever the brackets hold the instants:
so the events' order is one the real run could have had, and every read sees in the
simulator what it saw in the run. ``SimResult.replay["beyond_s"]`` reports how far
any event had to leave its bracket (0 when every bracket held its instant).

The simulator then runs on that timeline and decides everything itself with the real
policy objects and its own state: the versions each pull and each staleness check
read, each push's scale or drop, its staleness, the version it is applied at, the
counters the coordinator's samples see and SaPS's flags (for eager-SGD: which ranks
contribute to each round). It does not take any of these from the trace; what it
takes is the order and the minibatches (each step's (partition, batch), so the
partitions' queues need no replay of the workers' takes). A replay reproduces the
run's decisions exactly when the simulator's rules are the trainer's; its
``replay`` record holds them, column by column, to compare with the trace.
"""
from __future__ import annotations

import heapq
import itertools

import numpy as np

from sgd_shm.core.status import FLAGGED, HIST_BINS, RUNNING
from sgd_shm.sim._ps import LOG_FIELDS, PSSim, SimSampleView

__all__ = ["DECISIONS", "PSReplay", "eager_replay_class", "eager_timeline", "least_times",
           "ps_timeline"]

#: the columns of a replay's decisions per worker (as the trace's columns)
DECISIONS = ("pulled", "decided", "flagged", "dropped", "read", "applied", "scale")
#: the gap between two ordered events at the same bracket start (virtual seconds)
EPS = 1e-9


def least_times(lo, edges, eps=EPS):
    """The least x with ``x[i] >= lo[i]`` and ``x[b] >= x[a] + eps`` for every (a, b)
    in ``edges``: each node at its lower bound or just after its last predecessor,
    in one pass over a topological order. Raises ValueError on a cycle (an order no
    run can have: the trace's brackets do not hold their calls)."""
    n = len(lo)
    x = np.array(lo, dtype=np.float64)
    succ = [[] for _ in range(n)]
    indeg = [0] * n
    for a, b in edges:
        succ[a].append(b)
        indeg[b] += 1
    todo = [i for i in range(n) if indeg[i] == 0]
    done = 0
    while todo:
        a = todo.pop()
        done += 1
        nxt = x[a] + eps
        for b in succ[a]:
            x[b] = max(x[b], nxt)
            indeg[b] -= 1
            if indeg[b] == 0:
                todo.append(b)
    if done < n:
        raise ValueError("replay: the trace's recorded order has a cycle; its brackets do "
                         "not hold their calls (was it recorded by ps.train(trace=True)?)")
    return x


class _Graph:
    """Nodes (a bracket start and end each) and order edges."""

    def __init__(self):
        self.lo, self.hi, self.edges = [], [], []

    def node(self, lo, hi):
        self.lo.append(float(lo))
        self.hi.append(float(hi))
        return len(self.lo) - 1

    def after(self, a, b):
        """b after a (None: no such node)."""
        if a is not None and b is not None:
            self.edges.append((a, b))

    def chain(self, nodes):
        for a, b in itertools.pairwise(nodes):
            self.after(a, b)


def _status_split(writes, k, seen, d0, d1):
    """The number of worker k's status writes (``writes``: its (t0, t1, status),
    in order) before a look at its flag that saw ``seen`` (1 flagged, 0 not) in the
    bracket (d0, d1): those surely before it (ended before d0), then any that
    overlap it, one by one, until the flag after them is the one seen."""
    c = sum(1 for w in writes if w[1] < d0)

    def flag(c):
        return int(c > 0 and writes[c - 1][2] == FLAGGED)
    while flag(c) != seen and c < len(writes) and writes[c][0] < d1:
        c += 1
    return c


#: a traced push's events, in its worker's order: the pull; the staleness check's
#: read of the version (``decide``) and of the worker's flag (``flag``, then the
#: policy's answer); an applied push's read of the version as the store began it
#: (``read``), its count in the slot's pushes (``count``) and staleness sum (``sum``),
#: and the version's increment (``tick``); a dropped push's report: staleness sum
#: (``sum``), then dropped count (``count``)
APPLIED_EVENTS = ("read", "count", "sum", "tick")
DROPPED_EVENTS = ("sum", "count")


def ps_timeline(trace):
    """The replay's timeline of a :class:`~sgd_shm.core.traces.PSTrace`: (rows, samples,
    writes, beyond): per worker, per row, the virtual times of its events (those the
    row has: "pull", "decide", "flag", then :data:`APPLIED_EVENTS` or
    :data:`DROPPED_EVENTS`); per sample, the times of its reads of the staleness sums
    and of the pushes tried (its history time when it read none), and its history
    time; per status write, (time, worker, status); and the most seconds any event
    left its bracket."""
    g = _Graph()
    rows, ticks = [], {}
    for k, st in enumerate(trace.steps):
        mine, chain = [], []
        for i in range(st["pulled"].shape[0]):
            r = {"pull": g.node(st["pull0"][i], st["pull1"][i])}
            if st["decided"][i] >= 0:
                for name in ("decide", "flag"):
                    r[name] = g.node(st["decide0"][i], st["decide1"][i])
            names = APPLIED_EVENTS if st["applied"][i] >= 0 else \
                DROPPED_EVENTS if st["dropped"][i] else ()
            for name in names:
                r[name] = g.node(st["push0"][i], st["push1"][i])
            if "tick" in r:
                ticks[int(st["applied"][i])] = r["tick"]
            chain.extend(r.values())                   # in the order they were made
            mine.append(r)
        g.chain(chain)
        rows.append(mine)
    _version_edges(g, trace, rows, ticks)
    coord = _coordinator_edges(g, trace, rows)
    x = least_times(g.lo, g.edges)
    beyond = float(np.max(np.maximum(x - np.array(g.hi), 0.0), initial=0.0))
    times = [[{n: float(x[v]) for n, v in r.items()} for r in mine] for mine in rows]
    return times, _sample_times(trace, x, coord), \
        [(float(x[n]), k, s) for n, k, s in coord["writes"]], beyond


def _version_edges(g, trace, rows, ticks):
    """Pushes in the order of their versions; a read of version v between the push
    that made v and the one that made v + 1."""
    for a in sorted(ticks):
        g.after(ticks.get(a - 1), ticks[a])
    for k, st in enumerate(trace.steps):
        for i, r in enumerate(rows[k]):
            for name, col in (("pull", "pulled"), ("decide", "decided"), ("read", "read")):
                if name in r:
                    v = int(st[col][i])
                    g.after(ticks.get(v), r[name])
                    g.after(r[name], ticks.get(v + 1))


def _between(g, events, n, node):
    """``node`` after the first n of ``events`` and before the rest."""
    if n <= len(events):
        g.after(events[n - 1] if n > 0 else None, node)
        g.after(node, events[n] if n < len(events) else None)


def _sum_range(cum, total, most):
    """(lo, hi): the counts m <= ``most`` whose running staleness sum ``cum[m]`` is
    ``total`` (None when none is)."""
    m = np.flatnonzero(cum[:most + 1] == total)
    return (int(m[0]), int(m[-1])) if m.size else None


def _coordinator_edges(g, trace, rows):
    """The coordinator's counter reads (the staleness sums, then the pushes tried)
    and status writes, in their order; each read after the counts it saw and before
    the next ones; each look at a worker's flag on its side of the status writes."""
    counts, sums, cums = [], [], []
    for k, st in enumerate(trace.steps):
        counts.append([r["count"] for r in rows[k] if "count" in r])
        sums.append([r["sum"] for r in rows[k] if "sum" in r])
        stale = np.where(st["applied"] >= 0, st["read"] - st["pulled"],
                         st["decided"] - st["pulled"])[(st["applied"] >= 0) | (st["dropped"] == 1)]
        cums.append(np.concatenate([[0], np.cumsum(stale)]))
    events = [(t0, t1, "read", m) for m, (t0, t1, _, _) in enumerate(trace.reads)]
    events += [(t0, t1, "write", m) for m, (t0, t1, _, _) in enumerate(trace.status)]
    events.sort()
    nodes, reads, writes = [], {}, []
    for t0, t1, kind, m in events:
        if kind == "write":
            n = g.node(t0, t1)
            nodes.append(n)
            _, _, k, s = trace.status[m]
            writes.append((n, int(k), int(s)))
            continue
        ns, nc = g.node(t0, t1), g.node(t0, t1)
        nodes += [ns, nc]
        reads[m] = (ns, nc)
        _, _, total, tried = trace.reads[m]
        for k in range(len(counts)):
            _between(g, counts[k], int(tried[k]), nc)
            got = _sum_range(cums[k], int(total[k]), int(tried[k]))
            if got is not None:                    # after m_lo sums, before m_hi + 1
                g.after(sums[k][got[0] - 1] if got[0] > 0 else None, ns)
                g.after(ns, sums[k][got[1]] if got[1] < len(sums[k]) else None)
    g.chain(nodes)
    _flag_edges(g, trace, rows, writes)
    return {"reads": reads, "writes": writes}


def _flag_edges(g, trace, rows, writes):
    per = {}
    for n, k, s in writes:
        per.setdefault(k, []).append((g.lo[n], g.hi[n], s, n))
    for k, st in enumerate(trace.steps):
        ws = per.get(k, [])
        for i, r in enumerate(rows[k]):
            seen = int(st["flagged"][i])
            if "flag" not in r or seen < 0 or not ws:
                continue
            node = r["flag"]
            c = _status_split(ws, k, seen, g.lo[node], g.hi[node])
            g.after(ws[c - 1][3] if c > 0 else None, node)
            g.after(node, ws[c][3] if c < len(ws) else None)


def _sample_times(trace, x, coord):
    """Per sample (history time ts): (the virtual times of its reads of the sums and
    of the counts, ts); a sample reads the first counter read that began at or after
    ts and before the next sample (none: both at ts)."""
    out, reads = [], sorted((trace.reads[m][0], m) for m in coord["reads"])
    nxt = list(trace.samples[1:]) + [np.inf]
    j = 0
    for ts, te in zip(trace.samples, nxt):
        while j < len(reads) and reads[j][0] < ts:
            j += 1
        if j < len(reads) and reads[j][0] < te:
            ns, nc = coord["reads"][reads[j][1]]
            out.append((float(x[ns]), float(x[nc]), float(ts)))
            j += 1
        else:
            out.append((float(ts), float(ts), float(ts)))
    return out


# ---- the simulator on the timeline ------------------------------------------------------------
EVENTS = ("pull", "decide", "flag", "read", "count", "sum", "tick")
SUMS, SAMPLE, STATUS = len(EVENTS), len(EVENTS) + 1, len(EVENTS) + 2


class _ReplayView(SimSampleView):
    """The sample's view: the staleness sums as its first read saw them."""

    def __init__(self, now, sim, sums):
        super().__init__(now, sim)
        self._sums = sums

    def staleness_sum(self, k):
        return int(self._sums[k])


class PSReplay(PSSim):
    """The parameter server on a traced run's timeline (see the module notes): each
    row of the trace is a step whose events happen at the timeline's times; the
    simulator decides each of them with its own state and the real policy (a row
    the simulator decides otherwise than the run still moves the counters at the
    run's times: its own choice of them)."""

    def __init__(self, prob, cfg):
        super().__init__(prob, cfg)
        tr = self.trace = cfg.replay
        self.tl, self.samples, self.writes, self.beyond = ps_timeline(tr)
        self.dec = []
        for st in tr.steps:
            d = {c: np.full(st["pulled"].shape[0], -1, np.int64) for c in DECISIONS}
            d["scale"] = np.full(st["pulled"].shape[0], np.nan)
            self.dec.append(d)
        self.sim_reads, self.sums = [], None
        self.used = set()                            # status writes already replayed
        self.now_t = 0.0                             # the current sample's virtual time
        self.row = [None] * self.n                   # per worker: its current step

    def run(self):
        for k, rows in enumerate(self.tl):
            for i, r in enumerate(rows):
                for name, t in r.items():
                    self.at(t, EVENTS.index(name), (k, i))
        for m, (ts_sum, ts_cnt, ts) in enumerate(self.samples):
            self.at(ts_sum, SUMS, m)
            self.at(ts_cnt, SAMPLE, ts)
        self.record(0.0)
        handlers = (self.r_pull, self.r_decide, self.r_flag, self.r_read, self.r_count,
                    self.r_sum, self.r_tick, self.r_sums, self.r_sample, self.r_status)
        t = 0.0
        while self.heap:
            t, _, kind, arg = heapq.heappop(self.heap)
            handlers[kind](t, arg)
        self.stop_t = max(t, self.samples[-1][2] if self.samples else 0.0)
        return self

    # ---- a step's events -----------------------------------------------------------------
    def r_pull(self, t, arg):
        k, i = arg
        st = self.trace.steps[k]
        p, j = int(st["partition"][i]), int(st["batch"][i])
        v = self.state.version
        self.dec[k]["pulled"][i] = v
        self.dec[k]["dropped"][i] = 0
        g = self.grads[k]
        if g is None:
            g = self.grads[k] = np.empty(self.d)
        self.model.grad(self.w, self.data, self.batches.rows_of(p, j), g)
        self.row[k] = {"i": i, "v": v, "p": p, "j": j, "scale": 1.0, "tau": None,
                       "read": None, "ticked": False}
        if "decide" not in self.tl[k][i] and self.policy.uses_staleness:
            self.r_decide(t, arg)
            self.r_flag(t, arg)

    def r_decide(self, t, arg):
        k, i = arg
        row = self.row[k]
        row["tau"] = self.state.version - row["v"]
        self.dec[k]["decided"][i] = self.state.version

    def r_flag(self, t, arg):
        """The worker's flag, then the policy's answer: a scale, or None (drop)."""
        k, i = arg
        row = self.row[k]
        flagged = self.state.status_[k] == FLAGGED
        self.dec[k]["flagged"][i] = int(flagged)
        row["scale"] = self.policy.push_scale(row["tau"], flagged)
        self.dec[k]["dropped"][i] = int(row["scale"] is None)

    def _last(self, k, i, name):
        return name == next(reversed(self.tl[k][i]))

    def r_read(self, t, arg):
        k, i = arg
        row = self.row[k]
        if row["scale"] is not None:
            row["read"] = self.state.version
            self.dec[k]["read"][i] = row["read"]

    def r_count(self, t, arg):
        k, i = arg
        if self.row[k]["scale"] is None:
            self.dropped[k] += 1
        else:
            self.state.pushes_[k] += 1
            self.bytes_sent[k] += 8 * self.d
        if self._last(k, i, "count"):
            self.r_tick(t, arg)

    def r_sum(self, t, arg):
        k = arg[0]
        row = self.row[k]
        if row["scale"] is None:
            self.stale_sum[k] += row["tau"]
            return
        if row["read"] is None:                        # a run's drop the simulator pushes
            self.r_read(t, arg)
        tau = row["read"] - row["v"]
        self.stale_sum[k] += tau
        self.hist[k, min(max(tau, 0).bit_length(), HIST_BINS - 1)] += 1

    def r_tick(self, t, arg):
        k, i = arg
        row = self.row[k]
        if row["scale"] is None or row["ticked"]:
            return
        row["ticked"] = True
        st = self.state
        self.w -= self.cfg.lr(row["v"]) * row["scale"] * self.grads[k]
        self.log.append((t, k, row["p"], row["j"], row["v"], st.version, row["scale"]))
        st.version += 1
        self.dec[k]["applied"][i] = st.version
        self.dec[k]["scale"][i] = row["scale"]
        self.applied += 1
        if row["p"] != k:
            self.stolen[k] += 1

    # ---- the coordinator -----------------------------------------------------------------
    def r_sums(self, t, m):
        self.sums = self.stale_sum.copy()

    def r_sample(self, t, ts):
        self.record(ts)
        sums = self.stale_sum.copy() if self.sums is None else self.sums
        self.sim_reads.append((sums, np.array(self.state.pushes_) + self.dropped))
        self.sums = None
        self.now_t = t
        self.policy.on_sample(_ReplayView(ts, self, sums))
    def flag(self, k, now):
        self.flagged.add(k)
        self.write_off(k)
        self._status(k, FLAGGED)
        self.events.append((now, k, True))
        if all(w != k for _, w in self.detections):
            self.detections.append((now, k))

    def unflag(self, k, now):
        self.flagged.discard(k)
        self._status(k, RUNNING)
        self.events.append((now, k, False))

    def _status(self, k, status):
        """The status lands when the real coordinator's matching write landed (the
        first not yet replayed, of worker k to ``status``, after this sample's
        read); at once when the run had none."""
        t = self.now_t
        for n, (tw, kw, sw) in enumerate(self.writes):
            if n not in self.used and kw == k and sw == status and tw >= t:
                self.used.add(n)
                self.at(tw, STATUS, (k, status))
                return
        self.state.status_[k] = status

    def r_status(self, t, arg):
        k, status = arg
        self.state.status_[k] = status

    def record_replay(self):
        """The replay's record: the simulator's decisions per worker (columns
        :data:`DECISIONS`), the counters its samples saw, and ``beyond_s``."""
        return {"steps": self.dec, "reads": self.sim_reads, "beyond_s": self.beyond,
                "log_fields": LOG_FIELDS}


# ---- eager-SGD ----------------------------------------------------------------------------------
def eager_timeline(trace):
    """The replay's timeline of an :class:`~sgd_shm.core.traces.EagerTrace`: per
    rank, per round, the virtual times {"lag", "post"} of its look at the lag and of
    its arrival, and the most seconds any event left its bracket. Orders: a rank's
    calls follow one another; a round closes at its closer's arrival (solo: its one
    contributor; majority: the round's initiator, which the ranks saw contribute;
    sync: its last arrival), after its other contributors' and before its late
    arrivals, the looks at the lag that found it closed and every rank's next round;
    a look that found it open comes before its close."""
    from sgd_shm.collectives.base import initiator
    g = _Graph()
    P, kind = trace.n_workers, trace.collective
    rows, by_round = [], {}
    for k, st in enumerate(trace.ranks):
        mine, chain = [], []
        for i in range(st["round"].shape[0]):
            r = int(st["round"][i])
            node = {"lag": g.node(st["lag0"][i], st["lag1"][i]),
                    "post": g.node(st["post0"][i], st["post1"][i])}
            chain += [node["lag"], node["post"]]
            mine.append(node)
            by_round.setdefault(r, {})[k] = (i, node)
        g.chain(chain)
        rows.append(mine)
    for r, ranks in by_round.items():
        st0 = trace.ranks[next(iter(ranks))]
        mask = int(st0["mask"][ranks[next(iter(ranks))][0]])
        members = [j for j in range(P) if mask >> j & 1 and j in ranks]
        closer = _closer(kind, members, initiator(trace.seed, r, P) if kind == "majority"
                         else None, r)
        closes = [ranks[c][1]["post"] for c in members] if closer is None else \
            [ranks[closer][1]["post"]]
        for k, (i, node) in ranks.items():
            st = trace.ranks[k]
            if k in members and closer is not None and k != closer:
                g.after(node["post"], closes[0])
            elif k not in members:
                for c in closes:
                    g.after(c, node["post"])
            for c in closes:
                if st["skipped"][i]:
                    g.after(c, node["lag"])
                elif closer is not None:
                    g.after(node["lag"], c)
        for k, (i, node) in by_round.get(r + 1, {}).items():
            for c in closes:
                g.after(c, node["lag"])
    x = least_times(g.lo, g.edges)
    beyond = float(np.max(np.maximum(x - np.array(g.hi), 0.0), initial=0.0))
    return [[{n: float(x[v]) for n, v in node.items()} for node in mine] for mine in rows], \
        beyond


def _closer(kind, members, init, r):
    """The rank whose arrival closed round r (None for sync: its last arrival)."""
    if kind == "sync":
        return None
    if kind == "solo":
        if len(members) != 1:
            raise ValueError(f"replay: solo round {r} has contributors {members}; a solo round "
                             "has one")
        return members[0]
    if init not in members:
        raise ValueError(f"replay: majority round {r}'s initiator {init} is not among its "
                         f"contributors {members}; was the trace recorded with this seed?")
    return init


def eager_replay_class():
    """:class:`EagerReplay` (made on first use: the eager simulator is imported then)."""
    from sgd_shm.sim._eager import POST, START, EagerSim

    class EagerReplay(EagerSim):
        """eager-SGD on a traced run's timeline: rank k's look at the lag of round r
        and its arrival happen at the timeline's times; the simulator decides whether
        it skips, whether it is late and, by the collective's rule, when each round
        closes and who contributes."""

        def __init__(self, prob, cfg):
            super().__init__(prob, cfg)
            self.trace = cfg.replay
            self.tl, self.beyond = eager_timeline(self.trace)
            self.rounds = 1 + max((int(st["round"].max()) for st in self.trace.ranks
                                   if st["round"].size), default=-1)
            self.round0 = min((int(st["round"].min()) for st in self.trace.ranks
                               if st["round"].size), default=0)

        def run(self):
            self.record(0.0, 0)
            for k, rows in enumerate(self.tl):
                st = self.trace.ranks[k]
                for i, node in enumerate(rows):
                    r = int(st["round"][i])
                    self.at(node["lag"], START, (k, r))
                    self.at(node["post"], POST, (k, r))
            handlers = (self.r_start, self.r_post, self.done)
            t = 0.0
            while self.heap:
                t, _, kind, arg = heapq.heappop(self.heap)
                handlers[kind](t, arg)
            self.end = [t] * self.P
            return self

        def r_start(self, t, arg):
            k, r = arg
            if self.closed_upto > r:                       # behind: catch up only
                self.skipped[k] += 1
                self.skips.append((k, r))
                self.pending[k] = (r, None)
                return
            g = np.empty(self.d)
            self.model.grad(self.w, self.data, self.minibatch(k), g)
            self.bytes_dense += 8 * self.d
            self.pending[k] = (r, g)

        def r_post(self, t, arg):
            k, r = arg
            c = self.contribution(k, self.pending[k][1])
            if r < self.closed_upto:                        # late
                self.late[k] += 1
                self.keep_late(k, c)
                return
            self.arrive(t, k, r, c)

        def done(self, t, k):               # a result is taken: the timeline starts the rounds
            pass

        def record_replay(self):
            return {"beyond_s": self.beyond}

    return EagerReplay
