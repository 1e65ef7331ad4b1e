"""Incidents formed live equal the incidents ``runwatch analyze`` forms on the same run."""

from __future__ import annotations

import numpy as np

import runwatch
from runwatch.pipeline.analysis import analyze_run
from runwatch.store import open_store


def _log_faulty_run(db_path) -> None:
    """A real hook run: recurring loss spikes, a NaN, a slowdown seen by step time and
    tokens/s, and an Xid followed by NCCL timeouts on several ranks."""
    rng = np.random.default_rng(7)
    # The step times are made up: this process's CPU wait must not hold them.
    with runwatch.init(name="faulty", store=db_path, cpu_wait=False) as run:
        for step in range(1, 3001):
            loss = 2.0 + 6.0 * (step + 10.0) ** -0.35 + rng.normal(0, 0.004)
            if step % 400 == 0:
                loss *= 1.6  # a spike every 400 steps
            if step == 2500:
                loss = float("nan")
            slow = 1.8 if 1200 <= step < 1300 else 1.0
            step_time = 0.1 * slow * (1 + rng.normal(0, 0.01))
            run.log(
                {
                    "loss": loss,
                    "grad_norm": 1.0 + rng.normal(0, 0.02),
                    "step_time": step_time,
                    "tokens_per_s": 4096 / step_time,
                },
                step=step,
            )
            if step == 2000:
                run.event(
                    "xid",
                    message="NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus",
                    rank=3,
                    host="n5",
                )
                for rank in (0, 1, 2):
                    run.event(
                        "nccl_timeout",
                        message=f"[Rank {rank}] Watchdog caught collective operation timeout: "
                        f"WorkNCCL(SeqNum={9000 + rank}, OpType=ALLREDUCE) ran for 600042 ms",
                        rank=rank,
                        host="n1",
                    )


def _described(store, source: str) -> list[dict]:
    frame = store.incidents("faulty", source=source)
    out = []
    for row in frame.itertuples(index=False):
        members = store.incident_members(int(row.id))
        out.append(
            {
                "key": row.key,
                "title": row.title,
                "severity": row.severity,
                "count": int(row.count),
                "first_step": row.first_step,
                "last_step": row.last_step,
                "signature": row.signature,
                "hypotheses": row.hypotheses,
                "members": sorted(
                    zip(members["kind"], members["what"], members["step"], strict=True)
                ),
            }
        )
    return sorted(out, key=lambda d: d["key"])


def test_live_incidents_equal_the_replayed_ones(db_path):
    _log_faulty_run(db_path)
    with open_store(str(db_path)) as store:
        live = _described(store, "live")
        analyze_run(store, "faulty")
        replayed = _described(store, "replay")
    assert live == replayed
    titles = " | ".join(d["title"] for d in live)
    # The recurring spikes are one incident, the slowdown one (step time and tokens/s
    # together), the Xid and the timeouts after it one.
    spikes = [d for d in live if ("anomaly", "spike", 400) in d["members"]]
    assert len(spikes) == 1 and spikes[0]["count"] >= 6, titles
    slow = [d for d in live if any(m[1] == "regression" for m in d["members"])]
    assert len(slow) == 1, titles
    assert {m[0:2] for m in slow[0]["members"]} >= {("anomaly", "regression")}
    xid = [d for d in live if ("event", "xid", 2000) in d["members"]]
    assert len(xid) == 1 and sum(m[1] == "nccl_timeout" for m in xid[0]["members"]) == 3
    assert xid[0]["severity"] == "critical"
    assert len(live) <= 8, titles
