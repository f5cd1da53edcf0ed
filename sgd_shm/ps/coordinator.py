"""The coordinator of a parameter-server run: it samples, detects, checkpoints and
stops, on any transport.

Every ``sample_every`` seconds it evaluates the training loss of the current weights
(on up to 4096 rows) and, given held-out data, their held-out loss and accuracy,
records (seconds, version, loss[, val_loss, val_score]), injects the faults that are
due, notices workers that died, calls the policy's ``on_sample`` hook (SaPS flags
stragglers there), writes a checkpoint when one is due, and stops at ``max_seconds``,
at the target loss, or when every worker is dead.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import numpy as np

from sgd_shm.core.errors import DivergenceError
from sgd_shm.ps.checkpoint import save_checkpoint
from sgd_shm.core.status import DEAD, FLAGGED


@dataclass
class SampleView:
    """What a policy's ``on_sample`` hook sees and may do: the time, the workers'
    counters, the flagged and killed workers, and flagging."""
    now: float
    coordinator: "Coordinator"

    @property
    def flagged(self) -> set:
        return self.coordinator.flagged

    @property
    def killed(self) -> list:
        return self.coordinator.killed

    _counters: tuple | None = None

    def _read(self):
        if self._counters is None:                # one read of the backend per sample
            self._counters = self.coordinator.backend.counters()
        return self._counters

    def staleness_sum(self, k) -> int:
        return int(self._read()[0][k])

    def pushes_tried(self, k) -> int:
        """Pushes applied plus pushes dropped."""
        return int(self._read()[1][k])

    def flag(self, k):
        self.coordinator.flag(k, self.now)

    def unflag(self, k):
        self.coordinator.unflag(k, self.now)


@dataclass
class Coordinator:
    backend: object
    policy: object
    evaluate: object                      # a core.results.Evaluator: weights -> record
    n_workers: int
    t_off: float = 0.0                    # seconds already trained (a resumed run)
    history: list = field(default_factory=list)
    detections: list = field(default_factory=list)
    events: list = field(default_factory=list)
    killed: list = field(default_factory=list)
    flagged: set = field(default_factory=set)
    written: list = field(default_factory=list)
    t_target: float | None = None

    # ---- flags ----------------------------------------------------------------------
    def unflagged_live(self):
        return [p for p in range(self.n_workers) if p not in self.flagged
                and p not in self.killed]

    def flag(self, k, now):
        self.flagged.add(k)
        self.backend.write_off(k, self.unflagged_live())
        self.backend.set_status(k, FLAGGED)
        self.events.append((self.t_off + now, k, True))
        if all(w != k for _, w in self.detections):
            self.detections.append((self.t_off + now, k))

    def unflag(self, k, now):
        self.flagged.discard(k)
        self.backend.set_status(k, 0)
        self.events.append((self.t_off + now, k, False))

    def _dead(self, k, how, lr):
        if how == "diverged":
            raise DivergenceError(
                f"training diverged: worker {k}'s gradient is NaN or inf after "
                f"{self.backend.version()} updates; lower lr (now {lr}) or raise alpha")
        if how != "killed":
            raise RuntimeError(f"parameter-server worker {k} failed: {how}")
        self.killed.append(k)
        self.backend.set_status(k, DEAD)
        self.flagged.discard(k)
        self.backend.write_off(k, self.unflagged_live())

    # ---- checkpoints ------------------------------------------------------------------
    def checkpoint(self, path, now, meta):
        w, vers, v, pushes, epochs = self.backend.snapshot()
        save_checkpoint(path, weights=w, shard_versions=vers, version=v, pushes=pushes,
                        epochs=epochs, seconds=self.t_off + now,
                        meta={**meta, "loss_value": self.evaluate.loss(w)})
        self.written.append((self.t_off + now, os.fspath(path)))

    # ---- the loop ---------------------------------------------------------------------
    def sample(self, now, cfg, bar):
        """One sample; True when the run should stop."""
        w, v = self.backend.pull()
        record = {"seconds": self.t_off + now, "step": v, **self.evaluate(w)}
        cur = record["loss"]
        self.history.append(record)
        if not np.isfinite(cur):
            raise DivergenceError(f"training diverged: the loss is {cur} after {v} "
                                     f"updates; lower lr (now {cfg.lr}) or raise alpha")
        if bar is not None:
            bar.n = round(min(now, cfg.max_seconds), 1)
            bar.set_postfix_str(f"updates {v:,}  loss {cur:.4f}"
                                + (f"  held-out acc {record['val_score']:.4f}"
                                   if "val_score" in record else "")
                                + (f"  flagged {sorted(self.flagged)}" if self.flagged else ""))
        for k, t_kill in list(self.faults.items()):
            if now >= t_kill:
                self.backend.kill(k)
                del self.faults[k]
        for k, how in self.backend.poll().items():
            self._dead(k, how, cfg.lr)
        self.policy.on_sample(SampleView(now, self))
        stop = any([bool(cb(dict(record))) for cb in cfg.callbacks])   # every one is called
        if cfg.target_loss is not None and cur <= cfg.target_loss and self.t_target is None:
            self.t_target = self.t_off + now
            return True
        return stop or now >= cfg.max_seconds or len(self.killed) == self.n_workers

    def run(self, cfg, meta, t0, bar=None):
        """Sample until the run stops; ``t0`` (``time.perf_counter()``) is when the
        workers were released."""
        self.faults = dict(cfg.faults)
        last_ckpt = 0.0
        while True:
            time.sleep(cfg.sample_every)
            now = time.perf_counter() - t0
            done = self.sample(now, cfg, bar)
            if cfg.checkpoint is not None and now - last_ckpt >= cfg.checkpoint_every:
                self.checkpoint(cfg.checkpoint, now, meta)
                last_ckpt = now
            if done:
                return
