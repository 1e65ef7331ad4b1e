"""Incident grouping: chains of co-occurring symptoms, recurring patterns, crash signatures."""

from __future__ import annotations

import random

from runwatch.detect.incidents import Member, form_incidents


def _spike(i: int, step: int, metric: str = "loss", size: float = 1.2, **labels) -> Member:
    return Member(
        "anomaly", i, "spike", step, step, "info", metric, tuple(sorted(labels.items())), size
    )


def _slow(i: int, step: int, metric: str, rank: int | None = None, what="regression") -> Member:
    labels = (("rank", rank),) if rank is not None else ()
    return Member("anomaly", i, what, step, step + 40, "warning", metric, labels, 1.5)


def _crash(i: int, step: int, attempt: int, message: str, host: str, rank: int) -> Member:
    return Member(
        "event",
        i,
        "crash",
        step,
        step,
        "critical",
        labels=(("host", host), ("rank", rank)),
        message=message,
        time=1000.0 * attempt + step,
        attempt=attempt,
    )


def _shape(incidents):
    return sorted((inc.key, inc.title, inc.count, tuple(sorted(inc.members))) for inc in incidents)


def test_recurring_spikes_are_one_incident_with_count_sizes_and_period():
    members = [_spike(i, 500 * (i + 1), size=1.05 + 0.01 * i) for i in range(12)]
    (inc,) = form_incidents(members)
    assert inc.count == 12 and inc.details["occurrences"] == 12
    assert inc.details["period"] == 500
    assert (inc.first_step, inc.last_step) == (500, 6000)
    assert inc.title.startswith("12 loss spikes of ×1.05–1.16")
    assert "largest at step 6,000" in inc.title


def test_grouping_does_not_depend_on_the_order_members_come_in():
    members = [_spike(i, 100 * i) for i in range(1, 9)]
    members += [_slow(20 + r, 1000, "step_time", rank=r) for r in range(4)]
    members += [_slow(30, 1010, "tokens_per_s")]
    members += [
        _crash(40 + a, 300 * a, a, f"IndexError: index {50000 + a} is out of bounds", "n1", a)
        for a in range(1, 4)
    ]
    want = _shape(form_incidents(members))
    for seed in range(5):
        shuffled = members[:]
        random.Random(seed).shuffle(shuffled)
        assert _shape(form_incidents(shuffled)) == want


def test_a_slowdown_on_every_rank_is_one_run_level_incident():
    members = [_slow(r, 1000 + r, "step_time", rank=r) for r in range(8)]
    members += [_slow(10, 1005, "tokens_per_s")]
    (inc,) = form_incidents(members)
    assert inc.count == 9 and "on 8 ranks" in inc.title
    # Later, one rank alone is slow against its peers: a separate incident naming it.
    alone = [Member("anomaly", 50, "straggler", 5000, 5050, "warning", "step_time", (("rank", 3),))]
    incidents = form_incidents(members + alone)
    assert len(incidents) == 2
    assert incidents[1].members == [("anomaly", 50)]


def test_crashes_with_one_signature_across_attempts_are_one_incident():
    starts = {1: 0, 2: 250, 3: 560, 4: 900}
    members = [
        _crash(
            a,
            300 * a,
            a,
            f"IndexError: index {50000 + a} is out of bounds for size 50257",
            f"n{a}",
            a,
        )
        for a in (1, 2, 3)
    ]
    members.append(_crash(9, 950, 4, "torch.OutOfMemoryError: CUDA out of memory", "n1", 0))
    incidents = form_incidents(members, attempt_starts=starts)
    assert len(incidents) == 2
    index = next(inc for inc in incidents if inc.count == 3)
    assert index.signature == "IndexError: index <num> is out of bounds for size <num>"
    assert "3 crashes in 3 attempts on 3 hosts" in index.title
    lost = [occ["steps_lost"] for occ in index.details["at"]]
    assert lost == [300 - 250, 600 - 560, 900 - 900]


def test_a_divergence_after_a_loss_spike_is_one_chain_apart_from_routine_spikes():
    members = [_spike(i, 1000 * i) for i in range(1, 6)]
    members.append(Member("anomaly", 99, "divergence", 5030, 5200, "critical", "loss", (), 3.0))
    incidents = form_incidents(members)
    crit = [inc for inc in incidents if inc.severity == "critical"]
    assert len(crit) == 1
    assert sorted(crit[0].members) == [("anomaly", 5), ("anomaly", 99)]
    assert crit[0].title.startswith("loss divergence of ×3 with loss spike")


def test_one_ranks_own_slowdown_is_judged_against_its_peers():
    """Among 10 ranks, rank 1 slower than its own baseline but not named a straggler is
    info; named a straggler, or with only 2 ranks to compare with, it stays a warning."""
    alone = [_slow(0, 300, "step_time", rank=1), _slow(1, 302, "tokens_per_s", rank=1)]
    (inc,) = form_incidents(alone, ranks={"step_time": 10, "tokens_per_s": 10})
    assert inc.severity == "info" and "9 peers" in inc.details["peers"]

    named = [*alone, _slow(2, 305, "step_time", rank=1, what="straggler")]
    (inc,) = form_incidents(named, ranks={"step_time": 10, "tokens_per_s": 10})
    assert inc.severity == "warning" and "peers" not in inc.details

    (inc,) = form_incidents(alone, ranks={"step_time": 2, "tokens_per_s": 2})
    assert inc.severity == "warning"
    (inc,) = form_incidents(alone)  # no rank counts known: nothing to judge against
    assert inc.severity == "warning"


def test_a_slowdown_every_rank_shares_is_not_cleared_by_the_peers():
    shared = [_slow(i, 300 + i, "step_time", rank=i) for i in range(6)]
    (inc,) = form_incidents(shared, ranks={"step_time": 6})
    assert inc.severity == "warning" and "peers" not in inc.details


def test_a_busy_host_joins_the_slowdown_it_explains_and_makes_no_incident_alone():
    busy = Member("anomaly", 0, "host_busy", 100, 180, "info", "host_cpu_wait")
    assert form_incidents([busy]) == []
    (inc,) = form_incidents([busy, _slow(1, 150, "step_time")])
    assert sorted(inc.members) == [("anomaly", 0), ("anomaly", 1)]
