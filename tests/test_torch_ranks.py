"""sgd_shm.torch.ranks.run_local: P local gloo ranks, their results, their failures."""
import pytest

pytest.importorskip("torch")

from torch_ddp_workers import exits, sum_of_ranks  # noqa: E402

from sgd_shm.torch.ranks import ok, run_local  # noqa: E402


def test_every_rank_joins_one_group_and_returns():
    res = ok(run_local(sum_of_ranks, 3, timeout=120), 3)
    assert res == [(r, 3, 6.0) for r in range(3)]      # 1 + 2 + 3 on every rank


def test_a_failing_rank_is_reported_and_the_others_do_not_hang():
    """Rank 1 raises before the allreduce; rank 0 waits in it until gloo's group
    timeout, then fails too (or is killed at the deadline): the call returns."""
    res = run_local(sum_of_ranks, 2, 1, timeout=30, group_timeout=3, destroy=False)
    assert res[1][0] == "error" and res[1][1] == "ValueError" and "on purpose" in res[1][2]
    assert res.get(0, ("error",))[0] == "error"
    with pytest.raises(RuntimeError, match="rank 1 of a test run failed: ValueError"):
        ok({1: res[1]}, 2, "a test run")
    with pytest.raises(RuntimeError, match=r"ranks \[1\] sent nothing"):
        ok({0: ("ok", 1)}, 2)


def test_a_last_rank_that_dies_is_reported():
    """The results know how many ranks ran: a last rank that died silently is named by
    ok() without a size (it returned the others' results before)."""
    res = run_local(exits, 2, 1, timeout=30, group_timeout=3, destroy=False)
    assert res.size == 2 and 1 not in res
    with pytest.raises(RuntimeError, match=r"ranks \[1\] sent nothing"):
        ok(res)


def test_bad_arguments():
    with pytest.raises(ValueError, match="size must be an int >= 1"):
        run_local(sum_of_ranks, 0)
    with pytest.raises(TypeError, match="fn must be a callable"):
        run_local("sum_of_ranks", 2)
    with pytest.raises(ValueError, match="timeout must be > 0"):
        run_local(sum_of_ranks, 2, timeout=0)
