"""The test suite's own scheduling under pytest-xdist (``tests/conftest.py``): tests
marked ``exclusive`` never overlap another test; the others do run two at a time."""
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def test_exclusive_tests_run_alone_under_xdist(tmp_path):
    pytest.importorskip("xdist")
    shutil.copy(os.path.join(HERE, "conftest.py"), tmp_path / "conftest.py")
    log = tmp_path / "log.jsonl"
    (tmp_path / "test_sleepy.py").write_text(textwrap.dedent(f"""
        import json, time
        import pytest

        def _record(name):
            t0 = time.time()
            time.sleep(0.4)
            with open({str(log)!r}, "a") as f:
                f.write(json.dumps([name, t0, time.time()]) + "\\n")

        @pytest.mark.parametrize("i", range(6))
        def test_shared(i):
            _record(f"s{{i}}")

        @pytest.mark.exclusive
        @pytest.mark.parametrize("i", range(3))
        def test_alone(i):
            _record(f"x{{i}}")
    """))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "-p",
                        "no:cacheprovider", "-W", "ignore::pytest.PytestUnknownMarkWarning",
                        str(tmp_path)], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert sorted(n for n, _, _ in rows) == sorted([f"s{i}" for i in range(6)] +
                                                   [f"x{i}" for i in range(3)])

    def overlap(a, b):
        return a[1] < b[2] and b[1] < a[2]
    for a in rows:
        if a[0].startswith("x"):
            assert not [b[0] for b in rows if b is not a and overlap(a, b)], a[0]
    shared = [a for a in rows if a[0].startswith("s")]
    assert any(overlap(a, b) for a in shared for b in shared if a is not b)
    assert max(e for n, _, e in shared) <= min(s for n, s, _ in rows if n.startswith("x"))
