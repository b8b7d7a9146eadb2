from nri_midbatch.cgroups.reload_burst import ReloadBurst, RepairTimings


def test_a_burst_of_reloads_gives_one_pass_after_its_last() -> None:
    burst = ReloadBurst(RepairTimings(quiet=1.0, longest=10.0))
    due = [burst.note(t / 10) for t in range(30)]  # 30 reloads within 3 s
    # Each reload pushes the pass back: the one that counts is after the last.
    assert due[-1] == 2.9 + 1.0
    assert burst.end() == 30
    # The next reload starts a burst of its own.
    assert burst.note(50.0) == 51.0
    assert burst.reloads == 1


def test_reloads_that_never_stop_still_get_a_pass_after_the_longest_wait() -> None:
    burst = ReloadBurst(RepairTimings(quiet=1.0, longest=10.0))
    due = [burst.note(t / 2) for t in range(100)]  # every 0.5 s for 50 s
    assert due[-1] == 10.0
    assert max(due) == 10.0
