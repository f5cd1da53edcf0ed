"""``python -m sgd_shm selftest`` (the smoke test CI runs on the installed wheel and
sdist) passes here too, and reports every component."""
import subprocess
import sys

from tests.test_docs import ROOT


def test_selftest_passes():
    p = subprocess.run([sys.executable, "-m", "sgd_shm", "selftest"], capture_output=True,
                       text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    for name in ("multiqueue", "multicounter", "greedy", "stm_and_conflict", "hogwild", "mf",
                 "parameter_server", "collectives_and_eager", "compress"):
        assert f"  {name} " in p.stdout
    assert p.stdout.rstrip().endswith("all checks passed")
