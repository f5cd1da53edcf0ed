"""Ray as its users expect it: an optional extra with a clear install message, a
connection that never hangs and never ignores an address, and a session that keeps
Ray (and idle actors) alive across several ``train(backend="ray")`` runs.

Rules of :func:`connect`:

* Ray is an optional extra (``pip install 'relaxed-sgd-kit[ray]'``):
  :func:`require_ray` imports it or raises an ``ImportError`` saying so.
* Ray already initialised in this process: ``address=None`` (or ``"auto"``) uses it;
  an address naming another cluster is a ``ValueError`` (a process talks to one
  cluster at a time; an address passed and then ignored would train somewhere the
  caller did not ask for), and so is a ``num_cpus`` other than the running one's.
* Not initialised, ``address=None``: what ``ray.init()`` does. That is a new local
  instance, logged at INFO (``sgd_shm.ps.ray_session``; nothing on stdout), unless
  ``RAY_ADDRESS`` or a ``ray start`` on this machine names a cluster, which is then
  joined as if its address had been passed.
* Not initialised, an address: ``ray.init(address="host:port")`` to a machine where
  nothing answers can hang for minutes, so the address is first tried with plain TCP
  connections until ``timeout`` seconds pass, and a ``ConnectionError`` naming the
  address comes back within that bound. ``"auto"`` is resolved as Ray resolves it
  (``RAY_ADDRESS``, the last ``ray start``, a running GCS process), with a prompt
  ``ConnectionError`` when nothing is found. ``ray://host:port`` (Ray Client) is
  tried at its client port.

:class:`RaySession` holds a connection for a block of code: it shuts Ray down at the
end only if it started it, and kills the idle actors it was given to keep, so that
later runs can reuse them (actors take seconds to start) and none outlives it.
"""
from __future__ import annotations

import contextlib
import logging
import math
import numbers
import os
import socket
import time
import warnings
from typing import Self

_log = logging.getLogger(__name__)          # a child of the package's "sgd_shm" logger

INSTALL_HINT = "backend=\"ray\" needs Ray, an optional extra: pip install 'relaxed-sgd-kit[ray]'"
RAY_CLIENT_PORT = 10001                     # Ray Client's default port (ray://host)

#: The niceness of the worker processes (the actors) of a Ray instance the kit starts.
#: Ray's own default is 15: its actors then run below every process at the default 0,
#: so on a node where anything else is busy (the coordinator sampling the loss, another
#: job) the training actors get a small share of the CPU, where the kit's shared-memory
#: workers, at 0, would get an even one. A cluster started by hand takes the same
#: setting from ``RAY_worker_niceness=0 ray start ...``; a run on a cluster whose actors
#: are niced warns (:func:`warn_if_niced`).
WORKER_NICENESS = 0
#: ``ray.init(_system_config=...)`` (and a ``ray.cluster_utils.Cluster`` head's) for a
#: local instance: actors at :data:`WORKER_NICENESS`
LOCAL_SYSTEM_CONFIG = {"worker_niceness": WORKER_NICENESS}


def require_ray():
    """The ``ray`` module; an ``ImportError`` with the install command if it is missing."""
    try:
        import ray
    except ImportError as e:
        raise ImportError(INSTALL_HINT) from e
    return ray


# -- arguments ---------------------------------------------------------------------------
def _check_timeout(timeout) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) \
            or not math.isfinite(timeout) or timeout <= 0:
        raise ValueError(f"timeout: must be a finite number of seconds > 0, got {timeout!r}")
    return float(timeout)


def _check_cpus(name: str, value) -> float:
    """A CPU count a worker actor declares: a finite number >= 0 (0: it takes none)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) \
            or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name}: must be a finite number of CPUs >= 0 (e.g. 1.0, or 0.5 "
                         f"for two workers a CPU), got {value!r}")
    return float(value)


def _check_num_cpus(num_cpus):
    if num_cpus is not None and (isinstance(num_cpus, bool)
                                 or not isinstance(num_cpus, numbers.Integral) or num_cpus < 1):
        raise ValueError(f"num_cpus: must be None (the machine's CPU count) or an integer "
                         f">= 1, got {num_cpus!r}")


def parse_address(address: str) -> tuple[str, int, bool]:
    """``(host, port, client)`` of ``"host:port"`` or ``"ray://host[:port]"`` (``client``:
    Ray Client, whose port defaults to 10001); ``[::1]:6379`` for IPv6. A ``ValueError``
    naming the rule otherwise (a ``TypeError`` for a non-string)."""
    rule = (f"address: must be None (a local instance), 'auto', 'host:port' (a cluster's "
            f"GCS, e.g. '10.0.0.5:6379') or 'ray://host:port' (Ray Client), got {address!r}")
    if not isinstance(address, str):
        raise TypeError(rule)
    client = address.startswith("ray://")
    rest = address[len("ray://"):] if client else address
    if client and (rest.endswith("]") or ":" not in rest):
        rest = f"{rest}:{RAY_CLIENT_PORT}"
    host, sep, port = rest.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 \
            or any(c in host for c in "/ @"):
        raise ValueError(rule)
    return host, int(port), client


# -- reaching a cluster -------------------------------------------------------------------
def wait_for_port(address: str, timeout: float) -> None:
    """Returns once a TCP connection to ``address``'s host and port succeeds, retrying
    until ``timeout`` seconds pass (a refused connection is retried too: a head node may
    be starting); then a ``ConnectionError`` naming the address."""
    host, port, _ = parse_address(address)
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        try:
            with socket.create_connection((host, port), timeout=max(min(left, 2.0), 0.01)):
                return
        except OSError as e:
            last = e
        left = deadline - time.monotonic()
        if left <= 0:
            raise ConnectionError(
                f"address: no Ray cluster answered at {address!r} within {timeout:g} s "
                f"(last error: {last}); start one there (ray start --head --port={port}), "
                f"check the host and port, or pass address=None for a local "
                f"instance") from last
        time.sleep(min(0.2, left))


def _found_address(address):
    """Where ``ray.init(address)`` would connect, for ``None`` or ``"auto"``: the cluster
    ``RAY_ADDRESS`` or the last ``ray start`` (or, for "auto", a running GCS) names, as
    ``host:port``; ``None`` when ``ray.init`` would start a new local instance. A
    ``ConnectionError`` for "auto" when there is no cluster to find."""
    if address not in (None, "auto"):
        return address
    env = os.environ.get("RAY_ADDRESS") or None
    if env and "://" in env:                          # Ray Client: ray.init takes it as is
        return env
    try:
        from ray._private.services import canonicalize_bootstrap_address
    except ImportError:                               # pragma: no cover - Ray's internals moved
        found = env or address
        return None if found in (None, "local") else found
    try:
        return canonicalize_bootstrap_address(address)
    except ConnectionError as e:
        raise ConnectionError(
            f"address: no Ray cluster found for {address!r} (no RAY_ADDRESS, no `ray start` "
            f"on this machine); pass the cluster's 'host:port', start one (ray start "
            f"--head), or pass address=None for a local instance") from e


def _init_at(ray, address: str, found: str, timeout: float) -> None:
    """``ray.init`` to the cluster at ``found`` (``address`` as the caller gave it), after
    its port answered within ``timeout``."""
    if found != "auto":
        wait_for_port(found, timeout)
    try:
        ray.init(address=found, configure_logging=False, log_to_driver=True)
    except ConnectionError as e:
        raise ConnectionError(f"address: could not connect to the Ray cluster at "
                              f"{address!r} ({found!r}): {e}") from e
    _log.info("connected to the Ray cluster at %s", found)


def _start_local(ray, num_cpus) -> None:
    ray.init(num_cpus=num_cpus, include_dashboard=False, configure_logging=False,
             log_to_driver=True, _system_config=LOCAL_SYSTEM_CONFIG)
    cpus = ray.cluster_resources().get("CPU", 0)
    _log.info("started a local Ray instance with %g CPUs; it stops when the run (or the "
              "RaySession) ends", cpus)


def warn_if_niced(niceness) -> bool:
    """A ``RuntimeWarning`` when the worker actors run at a niceness above
    :data:`WORKER_NICENESS` (``niceness``: each actor's ``os.nice(0)``): any busy process
    at the default priority on their nodes then takes the CPU from them. Returns whether
    it found them niced."""
    worst = max(niceness, default=WORKER_NICENESS)
    if worst <= WORKER_NICENESS:
        return False
    warnings.warn(
        f"the Ray cluster runs its worker actors at nice {worst} (Ray's default is 15): "
        f"other busy processes on their nodes take the CPU first, and training slows or "
        f"stalls; start the cluster with RAY_worker_niceness={WORKER_NICENESS} ray start "
        f"... (an instance the kit starts does so itself)", RuntimeWarning, stacklevel=3)
    return True


# -- the running instance -----------------------------------------------------------------
def _local_ips() -> set[str]:
    ips = {"127.0.0.1", "::1"}
    with contextlib.suppress(OSError):
        ips.update(socket.gethostbyname_ex(socket.gethostname())[2])
    with contextlib.suppress(Exception):              # best effort: Ray's view of this node
        import ray
        ips.add(ray.util.get_node_ip_address())
    return ips


def _ip(host: str) -> str:
    try:
        return socket.gethostbyname(host)
    except OSError:
        return host


def same_cluster(address: str, gcs_address: str) -> bool:
    """Whether ``address`` names the cluster whose GCS is at ``gcs_address`` ("auto"
    names any; ``ray://`` compares the host only, its port being the client's)."""
    if address == "auto":
        return True
    host, port, client = parse_address(address)
    ghost, gport, _ = parse_address(gcs_address)
    if not client and port != gport:
        return False
    a, b = _ip(host), _ip(ghost)
    local = _local_ips()
    return a == b or (a.startswith("127.") or a in local) and (b.startswith("127.") or b in local)


def _use_running(ray, address, num_cpus) -> None:
    """Checks that ``address`` names the cluster this process is connected to, and
    ``num_cpus`` (if given) its CPU count: neither is ignored silently."""
    if num_cpus is not None:
        have = ray.cluster_resources().get("CPU", 0)
        if have != num_cpus:
            raise ValueError(f"num_cpus: Ray already runs in this process with {have:g} "
                             f"CPUs, not {num_cpus}; leave num_cpus out to use it, or call "
                             f"ray.shutdown() first")
    if address is None or address == "auto":
        return
    try:
        gcs = ray.get_runtime_context().gcs_address
    except Exception:                                  # noqa: BLE001 - Ray Client mode
        gcs = None
    if gcs is None or not same_cluster(address, gcs):
        raise ValueError(
            f"address: Ray is already connected to the cluster at {gcs!r} in this process, "
            f"not {address!r}; call ray.shutdown() first to connect elsewhere, or pass "
            f"address=None to use the running one")


#: seconds within which an unreachable address fails when no ``timeout`` is given
CONNECT_TIMEOUT = 30.0


def connect(address=None, *, timeout=None, num_cpus=None) -> bool:
    """Connects this process to Ray by the module's rules; True when it started a new
    local instance (the caller then shuts it down when done), False when it used the
    running one or joined a cluster.

    ``address``: None, "auto", "host:port" or "ray://host:port"; ``timeout``: seconds
    within which an unreachable address fails (None: ``CONNECT_TIMEOUT``, 30);
    ``num_cpus``: the CPUs of a new local instance (None: the machine's)."""
    ray = require_ray()
    timeout = _check_timeout(CONNECT_TIMEOUT if timeout is None else timeout)
    _check_num_cpus(num_cpus)
    if address is not None and address != "auto":
        parse_address(address)
    if ray.is_initialized():
        _use_running(ray, address, num_cpus)
        return False
    found = _found_address(address)
    if found is None:
        _start_local(ray, num_cpus)
        return True
    if num_cpus is not None:
        raise ValueError(f"num_cpus: sizes a new local instance, but Ray joins the cluster "
                         f"at {found!r} (the address, RAY_ADDRESS or `ray start`); leave "
                         f"num_cpus out, or unset RAY_ADDRESS / `ray stop` for a local one")
    _init_at(ray, address or found, found, timeout)
    return False


class RaySession:
    """Ray (and idle actors) kept alive across several ``train(backend="ray")`` runs::

        with RaySession(address=None, worker_cpus=1.0) as s:   # connects now
            ...                                                # runs reuse Ray and s's actors

    Connects on construction (:func:`connect`'s rules; ``started`` says whether it
    started Ray). ``worker_cpus``: the CPUs each worker actor declares (>= 0; 0.5 puts
    two workers on a CPU). :meth:`close` (also on leaving the ``with``) kills the pooled
    actors and shuts Ray down only if this session started it."""

    def __init__(self, address=None, worker_cpus=1.0, *, timeout=None, num_cpus=None):
        self.worker_cpus = _check_cpus("worker_cpus", worker_cpus)
        self.address = address
        self._pool: dict = {}
        self.closed = False
        self.started = connect(address, timeout=timeout, num_cpus=num_cpus)

    # -- a pool of idle actors, by key ---------------------------------------------------
    def keep(self, key, actor) -> None:
        """Pools an idle ``actor`` under the hashable ``key`` for a later run's
        :meth:`take`; on a closed session the actor is killed and a RuntimeError raised."""
        if self.closed:
            require_ray().kill(actor)
            raise RuntimeError("RaySession: closed; the actor given to keep() was killed")
        self._pool.setdefault(key, []).append(actor)

    def take(self, key):
        """A pooled actor under ``key`` (now the caller's), or None."""
        actors = self._pool.get(key)
        if not actors:
            return None
        actor = actors.pop()
        if not actors:
            del self._pool[key]
        return actor

    # -- the cluster ---------------------------------------------------------------------
    def cluster_cpus(self) -> float:
        """The CPUs of the cluster's live nodes."""
        return float(require_ray().cluster_resources().get("CPU", 0.0))

    def check_fits(self, n_workers: int, worker_cpus=None) -> None:
        """A ValueError when ``n_workers`` actors of ``worker_cpus`` CPUs each (default:
        the session's) need more CPUs than the cluster has: Ray would otherwise leave
        the actors pending forever."""
        cpus = self.worker_cpus if worker_cpus is None else _check_cpus("worker_cpus", worker_cpus)
        if isinstance(n_workers, bool) or not isinstance(n_workers, numbers.Integral) \
                or n_workers < 1:
            raise ValueError(f"n_workers: must be an integer >= 1, got {n_workers!r}")
        need, have = n_workers * cpus, self.cluster_cpus()
        if need > have:
            raise ValueError(
                f"worker_cpus: {n_workers} workers x {cpus:g} CPUs need {need:g} CPUs, the "
                f"Ray cluster has {have:g}: Ray would leave actors pending forever. Use "
                f"fewer workers, a smaller worker_cpus (e.g. train(..., session="
                f"RaySession(worker_cpus={have / n_workers:g})): the workers share the "
                f"{have:g} CPUs), or give Ray more CPUs (ray.init(num_cpus=...) or more "
                f"nodes)")

    # -- the end -------------------------------------------------------------------------
    def close(self) -> None:
        """Kills the pooled actors, then shuts Ray down if this session started it.
        Idempotent."""
        if self.closed:
            return
        self.closed = True
        ray = require_ray()
        pool, self._pool = self._pool, {}
        if ray.is_initialized():
            for actor in (a for actors in pool.values() for a in actors):
                ray.kill(actor)
        if self.started and ray.is_initialized():
            ray.shutdown()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{len(self._pool)} keys pooled"
        return (f"RaySession(address={self.address!r}, worker_cpus={self.worker_cpus:g}, "
                f"started={self.started}, {state})")
