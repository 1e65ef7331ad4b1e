"""Hypotheses ranked by evidence: seeded incidents whose cause is known."""

from __future__ import annotations

import math

import numpy as np
import pytest

from runwatch.detect.hypotheses import (
    CLEAR_SCORE,
    Hypothesis,
    rank_hypotheses,
    score,
    summarize,
)

HOSTS = 8
RANKS_PER_HOST = 8
SHARDS = [f"s{i:02d}" for i in range(25)]  # each read by 4% of steps


def host_of(rank: int) -> str:
    return f"n{rank // RANKS_PER_HOST}"


EXPOSURE = {
    "host": {f"n{h}": RANKS_PER_HOST for h in range(HOSTS)},
    "rank": {r: 1 for r in range(HOSTS * RANKS_PER_HOST)},
    "shard": {s: 1 for s in SHARDS},
}


def occurrence(rank: int, shard: str) -> dict:
    return {"host": host_of(rank), "rank": rank, "shard": shard}


def by_attribute(hyps: list[Hypothesis], attribute: str) -> list[Hypothesis]:
    return [h for h in hyps if h.attribute == attribute]


def test_data_dependent_bug_ranks_the_shard_first_and_hosts_as_spread():
    rng = np.random.default_rng(1)
    occ = [occurrence(int(rng.integers(64)), "s17") for _ in range(24)]
    hyps = rank_hypotheses(occ, EXPOSURE, noun="crashes")
    top = hyps[0]
    assert top.cause == "shard=s17" and top.clear
    assert (top.k, top.n, top.share) == (24, 24, pytest.approx(0.04))
    hosts = by_attribute(hyps, "host")
    assert len(hosts) == 8 and all(h.spread and not h.clear for h in hosts)
    assert top.evidence.startswith("24 of 24 crashes in steps with shard=s17, which is 4% of steps")
    assert "spread over 8 hosts, so not a host" in top.evidence
    assert summarize(hyps).startswith("likely shard=s17: 24 of 24 crashes")


def test_failing_host_ranks_first_across_all_shards():
    rng = np.random.default_rng(2)
    occ = [occurrence(int(rng.integers(40, 48)), SHARDS[int(rng.integers(25))]) for _ in range(16)]
    assert {o["host"] for o in occ} == {"n5"}
    hyps = rank_hypotheses(occ, EXPOSURE, noun="crashes")
    assert hyps[0].cause == "host=n5" and hyps[0].clear
    assert hyps[0].evidence.startswith("16 of 16 crashes on host n5, which has 12.5% of ranks")
    assert all(not h.clear for h in hyps[1:])
    assert all(h.spread for h in by_attribute(hyps, "shard"))


def test_flaky_link_puts_the_pair_then_both_hosts_above_anything_else():
    rng = np.random.default_rng(3)
    occ = [occurrence(int(rng.integers(16, 32)), SHARDS[int(rng.integers(25))]) for _ in range(32)]
    hyps = rank_hypotheses(occ, EXPOSURE, noun="crashes")
    assert hyps[0].cause == "host=n2+n3" and hyps[0].k == 32
    assert "on hosts n2 and n3 together" in hyps[0].evidence
    assert {h.cause for h in hyps[1:3]} == {"host=n2", "host=n3"}
    assert all(h.clear for h in hyps[:3])
    assert all(not h.clear for h in hyps[3:])
    assert not any(h.spread for h in by_attribute(hyps, "host"))


@pytest.mark.parametrize("seed", range(20))
def test_occurrences_by_exposure_have_no_clear_cause(seed):
    rng = np.random.default_rng(seed)
    occ = [
        occurrence(int(rng.integers(64)), SHARDS[int(rng.integers(25))])
        for _ in range(int(rng.integers(5, 60)))
    ]
    hyps = rank_hypotheses(occ, EXPOSURE, noun="crashes")
    assert max(h.score for h in hyps) < CLEAR_SCORE
    assert summarize(hyps).startswith("no clear cause")


def test_chance_reaches_the_threshold_in_at_most_one_percent_of_attributes():
    """The documented bound: under chance, P(any value of an attribute scores >= 2) <= 1%."""
    rng = np.random.default_rng(7)
    shares = np.array([0.5, 0.2, 0.1, 0.1, 0.05, 0.03, 0.015, 0.005])
    exposure = {"x": {f"v{i}": float(s) for i, s in enumerate(shares)}}
    trials, clear = 400, 0
    for _ in range(trials):
        values = rng.choice(len(shares), size=int(rng.integers(1, 80)), p=shares)
        hyps = rank_hypotheses([{"x": f"v{v}"} for v in values], exposure)
        clear += hyps[0].clear
    assert clear / trials <= 0.01


@pytest.mark.parametrize("share", [0.5, 0.125, 0.04, 1 / 1024, 1e-6])
def test_a_single_occurrence_is_weak_evidence_whatever_its_value(share):
    exposure = {"shard": {"rare": share, "rest": 1 - share}}
    (h,) = rank_hypotheses([{"shard": "rare"}], exposure, noun="crashes")
    assert (h.k, h.n) == (1, 1)
    assert h.score == pytest.approx(math.log10((1 + share) / 2))
    assert h.score <= 0 < CLEAR_SCORE
    assert h.evidence.startswith("1 of 1 crash in steps with shard=rare")


def test_score_matches_the_bayes_factor_by_numerical_integration():
    for k, n, p in [(9, 9, 0.04), (2, 9, 0.125), (16, 32, 0.125), (0, 5, 0.3), (40, 100, 0.25)]:
        q = np.linspace(p, 1, 400_001)
        marginal = np.trapezoid(q**k * (1 - q) ** (n - k), q) / (1 - p)
        expected = math.log10(marginal / (p**k * (1 - p) ** (n - k)) * p)
        assert score(k, n, p) == pytest.approx(expected, abs=1e-6)


def test_values_match_as_text_and_missing_attributes_do_not_count():
    occ = [{"rank": 7}, {"rank": "7"}, {"rank": 7, "shard": "a"}, {"rank": None}]
    hyps = rank_hypotheses(occ, {"rank": {"7": 1, "8": 1}, "shard": {"a": 1, "b": 3}})
    rank7 = next(h for h in hyps if h.attribute == "rank")
    assert (rank7.cause, rank7.k, rank7.n, rank7.value) == ("rank=7", 3, 3, "7")
    shard = next(h for h in hyps if h.attribute == "shard")
    assert (shard.k, shard.n, shard.share) == (1, 1, 0.25)


def test_a_value_under_its_share_says_so_and_ranking_is_deterministic():
    occ = [{"host": "a"}] * 2 + [{"host": "b"}] * 8
    hyps = rank_hypotheses(occ, {"host": {"a": 1, "b": 1}})
    assert [h.cause for h in hyps] == ["host=b", "host=a"]
    assert hyps[1].evidence.endswith("(no more than its share)")
    assert hyps == rank_hypotheses(occ, {"host": {"b": 1, "a": 1}})


def test_an_attribute_with_one_value_cannot_tell():
    (h,) = rank_hypotheses([{"code_version": "v1"}] * 5, {"code_version": {"v1": 10}})
    assert h.score == 0.0 and not h.spread
    assert h.evidence.endswith("which is all the steps, so it cannot tell")


@pytest.mark.parametrize(
    ("occurrences", "exposure", "message"),
    [
        ([], {"host": {"n1": 1}}, "occurrences is empty"),
        ([{"host": "n1"}], {"host": {"n1": -1, "n2": 2}}, r"exposure\['host'\]\['n1'\] is -1"),
        ([{"host": "n1"}], {"host": {"n1": float("nan")}}, "need finite >= 0"),
        ([{"host": "n1"}], {"host": {"n1": "x"}}, "not a number"),
        ([{"host": "n1"}], {"host": {"n1": 0, "n2": 0}}, "only zero weights"),
        (
            [{"host": "n9"}],
            {"host": {"n1": 1}},
            "occurrence 0 has host='n9', which has no exposure",
        ),
        ([{"host": "n1"}, {"host": "n2"}], {"host": {"n1": 1, "n2": 0}}, "weight is 0"),
        ([{"host": "n1"}, "n2"], {"host": {"n1": 1}}, "occurrence 1 is a str"),
        ({"host": "n1"}, {"host": {"n1": 1}}, "list of mappings"),
        ([{"host": "n1"}], {}, "exposure must be a non-empty mapping"),
        ([{"host": "n1"}], {"host": {}}, r"exposure\['host'\] must be a non-empty mapping"),
        ([{"rank": 1}], {"rank": {1: 1, "1": 1}}, "value '1' twice"),
    ],
)
def test_bad_input_names_what_is_wrong(occurrences, exposure, message):
    with pytest.raises(ValueError, match=message):
        rank_hypotheses(occurrences, exposure)


def test_score_rejects_impossible_counts():
    with pytest.raises(ValueError, match="0 <= k <= n"):
        score(3, 2, 0.5)
    with pytest.raises(ValueError, match="share must be in"):
        score(1, 2, 0.0)


def test_one_failing_host_is_not_blamed_on_a_pair():
    exposure = {"host": {f"n{i}": 4 for i in range(4)}}
    ranked = rank_hypotheses([{"host": "n2"}] * 5 + [{"host": "n0"}], exposure, noun="crashes")
    assert ranked[0].cause == "host=n2"
    assert not any("+" in h.cause for h in ranked if h.score >= ranked[0].score)
