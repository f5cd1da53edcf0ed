"""The command lines: ``python -m sgd_shm {ps,hogwild,eager,selftest}`` (and the
``sgd-shm`` console script) and ``python -m bench SCENARIO`` as argparse subcommands,
and the library's diagnostics through ``logging`` (no prints, nothing configured at
import, ``verbose=`` still shown). No assertion on speed."""
import ast
import importlib.metadata
import json
import logging
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import sgd_shm.__main__ as kit_cli

ROOT = pathlib.Path(__file__).resolve().parent.parent

#: options each command must list in its --help (besides -h and -v)
KIT_FLAGS = {
    "ps": ["--workers", "--slow", "--policies", "--seconds", "--target", "--samples",
           "--holdout", "--features", "--seed", "--backend", "--address", "--start-method", "--out"],
    "hogwild": ["--samples", "--features", "--epochs", "--seed"],
    "eager": ["--backend", "--workers", "--collectives", "--late", "--imbalance", "--seconds",
              "--target", "--reps", "--lr", "--alpha", "--batch", "--samples", "--holdout",
              "--features",
              "--seed", "--compress", "--epochs", "--out"],
    "selftest": ["--only"],
    "sim": ["--workers", "--policies", "--collectives", "--classes", "--step", "--gbps",
            "--latency", "--topology", "--imbalance", "--compress", "--epochs", "--target",
            "--samples", "--holdout", "--features", "--seed", "--out"],
}


def _run(*args, timeout=300):
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def _no_run(monkeypatch, module, attrs):
    """Make ``module``'s ``attrs`` fail the test if a --help ever calls them."""
    for a in attrs:
        monkeypatch.setattr(module, a, lambda *_, _a=a, **__: pytest.fail(f"{_a} ran"))


# -- python -m sgd_shm --------------------------------------------------------------------
def test_kit_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as e:
        kit_cli.main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for name in KIT_FLAGS:
        assert f"    {name} " in out, name


@pytest.mark.parametrize("command", list(KIT_FLAGS))
def test_kit_command_help_lists_its_flags_and_runs_nothing(command, capsys, monkeypatch):
    import importlib
    _no_run(monkeypatch, importlib.import_module(kit_cli.COMMANDS[command][0]),
            ["run", "check"])
    with pytest.raises(SystemExit) as e:
        kit_cli.main([command, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: python -m sgd_shm {command} ")
    for flag in KIT_FLAGS[command] + ["-v", "--verbose"]:
        assert flag in out, (command, flag)


def test_selftest_help_does_not_run_the_selftest():
    """The bug this replaced: ``selftest --help`` ran every check."""
    r = _run("-m", "sgd_shm", "selftest", "--help", timeout=120)
    assert r.returncode == 0, r.stderr
    assert "--only" in r.stdout and "selftest (python" not in r.stdout


@pytest.mark.parametrize("argv, message", [
    (["ps", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),        # the default, ps
    (["hogwild", "--epochs", "0"], "--epochs must be >= 1"),
    (["hogwild", "--epochs", "two"], "argument --epochs: invalid int value: 'two'"),
    (["eager", "--collectives", "gossip"], "--collectives: unknown ['gossip']"),
    (["selftest", "--only", "nope"], "--only: unknown check(s) ['nope']"),
    (["bogus"], "argument COMMAND: invalid choice: 'bogus'"),
    # tracebacks before: a negative seed, non-finite numbers (--seconds inf ran forever,
    # --slow nan ran unslowed), a combination only the library refuses
    (["sim", "--seed", "-1"], "argument --seed: must be an int >= 0, got -1"),
    (["hogwild", "--seed", "-3"], "argument --seed: must be an int >= 0, got -3"),
    (["ps", "--seconds", "inf"], "argument --seconds: must be a finite number, got 'inf'"),
    (["ps", "--slow", "nan"], "argument --slow: must be a finite number, got 'nan'"),
    (["eager", "--imbalance", "nan", "0"], "argument --imbalance: must be a finite number"),
    (["sim", "--lr", "x"], "argument --lr: expected a number, got 'x'"),
    (["sim", "--workers", "4", "--samples", "400", "--holdout", "100", "--features", "50",
      "--epochs", "1", "--policies", "asp", "--imbalance", "5", "0.001"],
     "imbalance: k must be an int in [0, n_workers=4], got 5 (-v shows the traceback)"),
])
def test_kit_bad_flags_exit_2_with_argparse_message(argv, message, capsys, tmp_path,
                                                    monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        kit_cli.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "usage: python -m sgd_shm" in err and message in err, err


@pytest.mark.parametrize("command", ["ps", "eager", "sim"])
def test_kit_out_that_cannot_be_a_folder_fails_before_the_work(command, tmp_path, capsys):
    """--out naming a file (or a path under one) is refused by the checks, before any
    run (a FileExistsError traceback after all the work, before)."""
    f = tmp_path / "a-file"
    f.write_text("")
    for out in (f, f / "below"):
        with pytest.raises(SystemExit) as e:
            kit_cli.main([command, "--out", str(out)])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert f"--out '{out}': cannot create the folder" in err, err
    fresh = tmp_path / "new" / "folder"
    args = kit_cli.build_parser()[1][command].parse_args(["--out", str(fresh)])
    kit_cli._module(command).check(kit_cli.build_parser()[1][command], args)
    assert fresh.is_dir()                                 # made by the check


def test_console_script_is_declared_and_installed():
    """``sgd-shm`` in pyproject.toml's [project.scripts], and in the installed metadata
    (``pip install -e .`` puts it on PATH), pointing at the same main()."""
    import tomllib
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["sgd-shm"] == "sgd_shm.__main__:main"
    eps = importlib.metadata.entry_points(group="console_scripts")
    (ep,) = [e for e in eps if e.name == "sgd-shm"]
    assert ep.value == "sgd_shm.__main__:main" and ep.load() is kit_cli.main


def test_tiny_ps_run(tmp_path):
    r = _run("-m", "sgd_shm", "ps", "--workers", "2", "--policies", "asp,saps", "--seconds",
             "0.5", "--samples", "2000", "--holdout", "500", "--features", "200", "--target",
             "0.69", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads((tmp_path / "ps-main.json").read_text())
    assert set(data["results"]) == {"asp", "saps"} and data["settings"]["command"] == "ps"
    assert "held-out acc" in r.stdout and data["target_kind"] == "held-out accuracy"
    for res in data["results"].values():           # scored on the held-out rows as it ran
        assert res["history"][-1]["val_score"] == res["val_score"] > 0.69
    r = _run("-m", "sgd_shm.ps", "--policies", "bsp", "--backend", "ray", "--start-method",
             "spawn", timeout=120)
    assert r.returncode == 2 and "--start-method applies to --backend shm" in r.stderr


def test_tiny_hogwild_run_logs_epochs_with_v():
    r = _run("-m", "sgd_shm", "hogwild", "-v", "--samples", "2000", "--features", "200",
             "--epochs", "1")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Hogwild, 2 processes" in r.stdout and "tau" in r.stdout
    assert "held-out acc" in r.stdout and "train loss" in r.stdout
    assert "INFO sgd_shm.hogwild.estimators: -- epoch 1: mean loss" in r.stderr


def test_tiny_eager_run(tmp_path):
    r = _run("-m", "sgd_shm.eager", "--workers", "2", "--collectives", "sync,solo",
             "--seconds", "0.3", "--samples", "2000", "--features", "200", "--out",
             str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads((tmp_path / "eager-main.json").read_text())
    assert set(data["summary"]) == {"sync", "solo"} and "held-out acc" in r.stdout
    for c, runs in data["runs"].items():
        assert runs[0]["history"][-1]["val_score"] == data["summary"][c]["val_score"]


def test_tiny_selftest_run():
    r = _run("-m", "sgd_shm", "selftest", "--only", "multicounter,compress")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "  multicounter " in r.stdout and "  compress " in r.stdout
    assert "  hogwild " not in r.stdout and r.stdout.rstrip().endswith("all checks passed")


# -- python -m bench ----------------------------------------------------------------------
def _bench():
    import bench.__main__ as bench_cli      # bench/: in the checkout, not in the wheel
    return bench_cli


def test_bench_help_lists_every_scenario(capsys):
    bench_cli = _bench()
    with pytest.raises(SystemExit) as e:
        bench_cli.main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for name in list(bench_cli.SCENARIOS) + ["all", "plot"]:
        assert f"    {name}" in out, name
    assert len(out.splitlines()) < 80          # not every scenario's flags


def test_bench_scenario_help_lists_only_its_flags_and_runs_nothing(capsys, monkeypatch):
    bench_cli = _bench()
    monkeypatch.setattr(bench_cli, "STEPS", {})          # a run would raise KeyError
    monkeypatch.setattr(bench_cli, "check", lambda *_: pytest.fail("check ran"))
    every = {bench_cli.FLAGS[n][0] for n in bench_cli.FLAGS}
    for name, (_, own) in list(bench_cli.SCENARIOS.items()) + [("all", (None, list(
            bench_cli.FLAGS))), ("plot", (None, []))]:
        with pytest.raises(SystemExit) as e:
            bench_cli.main([name, "--help"])
        assert e.value.code == 0, name
        out = capsys.readouterr().out
        assert out.startswith(f"usage: python -m bench {name} "), name
        mine = {bench_cli.FLAGS[n][0] for n in own + ["out"] + (["label"] if own else [])}
        for flag in every:
            assert (f"  {flag} " in out or f"  {flag}\n" in out) == (flag in mine), (name, flag)


def test_bench_flags_of_an_old_invocation_still_parse():
    """The README / docs / CI invocations keep their flags after the scenario."""
    bench_cli = _bench()
    ap, subs = bench_cli.build_parser()
    for argv in (["pq-threads", "--workers", "1-16", "--reps", "7"],
                 ["pq-threads", "--only", "mq-nogil", "--cxx-mq", "./mq_hold"],
                 ["mis", "--mis-parts", "", "--workers", "1,2", "--pbbs", "/x"],
                 ["hogwild", "--torch", "--cxx", "--workers", "1,2", "--reps", "7"],
                 ["ps", "--backend", "both", "--reps", "3", "--quick"],
                 ["compress", "--quick", "--no-mpi"], ["unreliable", "--quick"],
                 ["quality", "--workers", "1,2"], ["stm", "--reps", "7"], ["mf", "--reps", "5"],
                 ["delay"], ["conflict", "--quick"], ["eager", "--quick"], ["nonconvex"],
                 ["counter", "--label", "other"], ["all", "--quick", "--stm-tx", "300"],
                 ["plot", "--out", "/tmp/x"]):
        assert ap.parse_args(argv).scenario == argv[0]


@pytest.mark.parametrize("argv, message", [
    (["delay", "--stm-tx", "5"], "unrecognized arguments: --stm-tx 5"),   # not delay's
    (["delay", "--delay-samples", "0"], "--delay-samples must be >= 1"),
    (["ps", "--ps-seconds", "0"], "--ps-seconds must be > 0"),
    (["mis", "--mis-parts", "speed"], "--mis-parts: unknown part(s) ['speed']"),
    (["nope"], "argument SCENARIO: invalid choice: 'nope'"),
    ([], "the following arguments are required: SCENARIO"),
    (["delay", "--seed", "-1"], "argument --seed: must be an int >= 0, got -1"),
    (["delay", "--out", "/proc/version"], "--out '/proc/version': cannot create the folder"),
])
def test_bench_bad_flags_exit_2(argv, message, capsys):
    bench_cli = _bench()
    with pytest.raises(SystemExit) as e:
        bench_cli.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "usage: python -m bench" in err and message in err, err


def test_bench_tiny_delay_run(tmp_path):
    r = _run("-m", "bench", "delay", "--delay-samples", "500", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    d = json.loads((tmp_path / "delay.json").read_text())
    assert d["header"]["settings"] == {"scenario": "delay", "seed": 0, "delay_samples": 500,
                                       "out": str(tmp_path), "label": None}
    assert d["header"]["reps"] is None and d["results"]


# -- logging --------------------------------------------------------------------------------
def _xy():
    X = np.random.default_rng(0).normal(size=(200, 5))
    return X, (X[:, 0] > 0).astype(int)


def test_no_prints_in_library_code():
    """Progress and diagnostics go through logging; only command-line code prints
    (``__main__`` modules, the selftest, ``if __name__ == "__main__"`` blocks)."""
    hits = []
    for path in (ROOT / "sgd_shm").rglob("*.py"):
        if path.name in ("__main__.py", "selftest.py"):
            continue
        tree = ast.parse(path.read_text())
        skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                and "__main__" in ast.unparse(node.test) for n in ast.walk(node)}
        hits += [f"{path.relative_to(ROOT)}:{n.lineno}" for n in ast.walk(tree)
                 if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "print"
                 and id(n) not in skip]
    assert hits == []


def test_nothing_is_configured_at_import():
    code = ("import logging, sgd_shm, sgd_shm.hogwild.mlp, sgd_shm.hogwild.mf, sgd_shm.ps, "
            "sgd_shm.eager\n"
            "loggers = [logging.getLogger(n) for n in logging.root.manager.loggerDict "
            "if n.startswith('sgd_shm')]\n"
            "assert logging.root.handlers == [], logging.root.handlers\n"
            "assert all(all(isinstance(h, logging.NullHandler) for h in l.handlers) "
            "and l.level == logging.NOTSET for l in loggers if isinstance(l, logging.Logger))\n"
            "print('ok')")
    r = _run("-c", code, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


@pytest.mark.parametrize("make, expect", [
    ("HogwildClassifier(max_iter=2, tol=None, verbose=1, random_state=0)",
     "-- epoch 2: mean loss"),
    ("HogwildMLPClassifier((4,), max_iter=2, verbose=True, random_state=0)",
     "Iteration 2, loss = "),
])
def test_verbose_is_logged_at_info(make, expect, caplog):
    import warnings

    from sgd_shm import HogwildClassifier, HogwildMLPClassifier  # noqa: F401 (eval)
    X, y = _xy()
    with caplog.at_level(logging.INFO, logger="sgd_shm"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        eval(make).fit(X, y)
    infos = [r for r in caplog.records if r.levelno == logging.INFO]
    assert any(expect in r.getMessage() for r in infos), caplog.text
    assert all(r.name.startswith("sgd_shm.hogwild.") for r in infos)


def test_quiet_epochs_are_debug_records(caplog):
    from sgd_shm import MatrixFactorization
    from sgd_shm.data import make_ratings
    X, r = make_ratings(50, 20, 500, random_state=0)
    with caplog.at_level(logging.DEBUG, logger="sgd_shm.hogwild"):
        MatrixFactorization(n_factors=2, max_iter=2, random_state=0).fit(X, r)
    recs = [x for x in caplog.records if x.name == "sgd_shm.hogwild.mf"]
    assert [x.levelno for x in recs] == [logging.DEBUG] * 2
    assert recs[1].getMessage().startswith("-- epoch 2: training RMSE")


def test_verbose_without_logging_configured_prints_to_stdout():
    """verbose= keeps showing the epochs where the application configured no logging,
    and leaves no handler behind."""
    code = ("import logging, numpy as np\n"
            "from sgd_shm import MatrixFactorization, HogwildRegressor\n"
            "from sgd_shm.data import make_ratings\n"
            "X, r = make_ratings(50, 20, 500, random_state=0)\n"
            "MatrixFactorization(n_factors=2, max_iter=2, verbose=1, random_state=0).fit(X, r)\n"
            "Z = np.random.default_rng(0).normal(size=(100, 3))\n"
            "HogwildRegressor(max_iter=1, tol=None, verbose=1).fit(Z, Z[:, 0])\n"
            "HogwildRegressor(max_iter=1, tol=None).fit(Z, Z[:, 0])\n"
            "assert not logging.root.handlers and not any("
            "not isinstance(h, logging.NullHandler) for n in logging.root.manager.loggerDict "
            "if n.startswith('sgd_shm') for h in logging.getLogger(n).handlers)\n")
    r = _run("-c", code, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 3, lines
    assert lines[0].startswith("-- epoch 1: training RMSE")
    assert lines[1].startswith("-- epoch 2: training RMSE")
    assert lines[2].startswith("-- epoch 1: mean loss")
