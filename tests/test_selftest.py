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
                 "parameter_server", "collectives_and_eager", "compress",
                 "spawned_workers"):
        assert f"  {name} " in p.stdout
    assert p.stdout.rstrip().endswith("all checks passed")


def test_unsupported_platform_fails_clearly():
    code = "import sys; sys.platform = 'darwin'; import relaxed"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    assert p.returncode != 0
    assert "ImportError: relaxed-sgd-kit supports Linux only" in p.stderr
    assert "'darwin'" in p.stderr and "container" in p.stderr
