"""The C++ Hogwild! reference (``bench/cxx/hogwild.cpp``) for ``bench hogwild --cxx``.

Compiled on the spot with the system's C++ compiler (``g++ -O3 -march=native``); the
data go to a temporary folder as raw arrays, and every run of the reference is one
process that trains for E epochs and reports each epoch's seconds (measured inside
the program, as the kit's epochs are) and weights.
"""
from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

SOURCE = Path(__file__).resolve().parent / "cxx" / "hogwild.cpp"


def compiler():
    """The C++ compiler to use, or None (then ``--cxx`` is refused)."""
    return shutil.which("g++") or shutil.which("clang++")


class Reference:
    """A compiled reference and the problem it trains on; ``close()`` removes both."""

    def __init__(self, X, y):
        cxx = compiler()
        if cxx is None:
            raise RuntimeError("--cxx needs a C++ compiler (g++ or clang++) on PATH")
        self.dir = Path(tempfile.mkdtemp(prefix="cxx-hogwild-"))
        try:
            self.exe = self.dir / "hogwild"
            subprocess.run([cxx, "-O3", "-march=native", "-std=c++17", "-pthread", "-o",
                            str(self.exe), str(SOURCE)], check=True, capture_output=True,
                           text=True)
            self.data = self.dir / "data"
            self.data.mkdir()
            n, d = X.shape
            (self.data / "shape.txt").write_text(f"{n} {d} {X.nnz}\n")
            X.indptr.astype(np.int64).tofile(self.data / "indptr.bin")
            X.indices.astype(np.int32).tofile(self.data / "indices.bin")
            X.data.astype(np.float64).tofile(self.data / "data.bin")
            np.asarray(y, dtype=np.float64).tofile(self.data / "y.bin")
            self.d = d
        except BaseException:
            self.close()
            raise

    def run(self, workers, epochs, seed, alpha, t0, orders=None):
        """Train for ``epochs``; returns (seconds per epoch, [(coef, intercept) per epoch]).
        ``orders`` (tests): each epoch's order of the samples, instead of the reference's
        own shuffle."""
        args = [str(self.exe), str(self.data), str(workers), str(epochs), str(seed),
                repr(float(alpha)), repr(float(t0))]
        if orders is not None:
            np.ascontiguousarray(orders, dtype=np.int64).tofile(self.data / "orders.bin")
            args.append(str(self.data / "orders.bin"))
        r = subprocess.run(args, check=True, capture_output=True, text=True)
        times = [float(line.split()[1]) for line in r.stdout.splitlines()
                 if line.startswith("epoch ")]
        weights = [(np.fromfile(self.data / f"coef_{e}.bin"),
                    float(np.fromfile(self.data / f"intercept_{e}.bin")[0]))
                   for e in range(epochs)]
        return times, weights

    def close(self):
        shutil.rmtree(self.dir, ignore_errors=True)
