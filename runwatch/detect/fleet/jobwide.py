"""One job-wide slowdown is one finding: per-rank episodes that all ranks share, merged.

The per-series Monitor judges each rank's series alone, so when every rank of a synchronous
job slows together (a slower filesystem, a longer sequence length, a throttled switch) it
opens one "step time regression" per rank: N critical episodes for one cause. The fleet
median tells the two cases apart -- a straggler moves away from it, a job-wide slowdown moves
it -- and so does this merge: episodes of the same detector and metric, on at least
``min_share`` of the job's ranks, whose steps overlap, become one job-level episode (no
``rank`` label; ``details["ranks"]`` lists them, ``details["job_wide"]`` is True). Episodes
of fewer ranks are left alone: those ranks are the story.

>>> from runwatch.model import Anomaly
>>> eps = [Anomaly("regression", "step_time", 100 + r, 300, "critical", 5.0, 1.5,
...                "step_time 1.5x its baseline", labels={"rank": r, "host": "a"})
...        for r in range(3)]
>>> (one,) = merge_job_wide(eps, ranks=3)
>>> one.labels, one.start_step, one.details["ranks"]
({'host': 'a'}, 100, [0, 1, 2])
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence

from runwatch.model import SEVERITIES, Anomaly, label_value

PER_RANK_ONLY: frozenset[str] = frozenset({"straggler", "hang"})
"""Fleet detectors: their episodes are about one rank against the others, never merged."""


def merge_job_wide(
    anomalies: Sequence[Anomaly],
    *,
    ranks: int | Iterable[int] | None = None,
    min_share: float = 0.5,
) -> list[Anomaly]:
    """``anomalies`` with every job-wide group merged into one episode, in order of start.

    ``ranks``: how many ranks the job has (or which); default: the ranks any episode names.
    A group is job-wide when it spans at least ``max(2, min_share x ranks)`` distinct ranks.
    """
    if not 0.0 < min_share <= 1.0:
        raise ValueError(
            f"min_share must be in (0, 1]; valid values: 0 < min_share <= 1, got {min_share}"
        )
    ranked = [a for a in anomalies if a.detector not in PER_RANK_ONLY and _rank(a) is not None]
    if ranks is None:
        n = len({_rank(a) for a in ranked})
    elif isinstance(ranks, int):
        n = ranks
    else:
        n = len(set(ranks))
    need = max(2, math.ceil(min_share * n))
    merged: dict[int, Anomaly] = {}  # id of a member -> the merged episode
    groups: dict[tuple[str, str], list[Anomaly]] = {}
    for a in ranked:
        groups.setdefault((a.detector, a.metric), []).append(a)
    for members in groups.values():
        for cluster in _overlapping(members):
            if len({_rank(a) for a in cluster}) >= need:
                one = _merge(cluster, n)
                for a in cluster:
                    merged[id(a)] = one
    out: list[Anomaly] = []
    placed: set[int] = set()
    for a in anomalies:
        one = merged.get(id(a))
        if one is None:
            out.append(a)
        elif id(one) not in placed:
            placed.add(id(one))
            out.append(one)
    return out


def _rank(a: Anomaly) -> int | None:
    r = label_value(a.labels.get("rank"))
    return None if r is None else int(r)


def _overlapping(members: list[Anomaly]) -> list[list[Anomaly]]:
    """Clusters of episodes whose step ranges overlap (chained), by start step."""
    out: list[list[Anomaly]] = []
    end = None
    for a in sorted(members, key=lambda e: (e.start_step, e.end_step)):
        if end is not None and a.start_step <= end:
            out[-1].append(a)
            end = max(end, a.end_step)
        else:
            out.append([a])
            end = a.end_step
    return out


def _merge(cluster: list[Anomaly], n: int) -> Anomaly:
    first = min(cluster, key=lambda e: e.start_step)
    worst = max(cluster, key=lambda e: (SEVERITIES.index(e.severity), e.score))
    ranks = sorted({r for a in cluster if (r := _rank(a)) is not None})
    common = {
        k: v
        for k, v in first.labels.items()
        if k != "rank" and all(a.labels.get(k) == v for a in cluster)
    }
    share = f"all {n}" if len(ranks) >= n else f"{len(ranks)} of {n}"
    listed = ", ".join(map(str, ranks))
    details = dict(worst.details)
    details.update(job_wide=True, ranks=ranks, episodes=len(cluster))
    return dataclasses.replace(
        worst,
        labels=common,
        start_step=first.start_step,
        end_step=max(a.end_step for a in cluster),
        is_open=any(a.is_open for a in cluster),
        message=(f"job-wide on {share} ranks ({listed}), not a straggler: {worst.message}"),
        details=details,
    )
