"""Build of the compiled cores (Cython + GCC __atomic builtins).

Set RELAXED_NATIVE=1 to add -march=native, RELAXED_CACHE_LINE=64 to change the
padding of counters and lock guards (default 128 bytes).
"""
import os

from Cython.Build import cythonize
from setuptools import Extension, setup

cflags = ["-O3", "-fno-strict-aliasing", "-Wno-unused-function"]
if os.environ.get("RELAXED_NATIVE") == "1":
    cflags.append("-march=native")
macros = []
if os.environ.get("RELAXED_CACHE_LINE"):
    macros.append(("RELAXED_CACHE_LINE", os.environ["RELAXED_CACHE_LINE"]))

ext = [
    Extension(f"relaxed._{name}", [f"ext/_{name}.pyx"], include_dirs=["ext"],
              extra_compile_args=cflags, define_macros=macros)
    for name in ("base", "conflict", "multiqueue", "multicounter", "sched", "stm")
]

jobs = os.cpu_count() or 1        # translate and compile the modules side by side
setup(ext_modules=cythonize(ext, include_path=["ext"], language_level=3, nthreads=jobs,
                            compiler_directives={"embedsignature": True}),
      options={"build_ext": {"parallel": jobs}})
