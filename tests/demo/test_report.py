"""What ``runwatch demo`` prints about what it found."""

from __future__ import annotations

import pandas as pd

from runwatch.demo.runner import LISTED_AT_MOST, _listed, run_demo
from runwatch.demo.scenario import describe_faults
from runwatch.store import open_store


def _found(severities: list[str]) -> pd.DataFrame:
    n = len(severities)
    return pd.DataFrame(
        {
            "start_step": range(n),
            "end_step": range(n),
            "severity": severities,
            "detector": ["spike"] * n,
            "metric": ["loss"] * n,
            "message": [f"m{i}" for i in range(n)],
        }
    )


def test_short_list_keeps_every_anomaly_in_step_order():
    listed, unlisted = _listed(_found(["info", "critical", "info", "warning"]))
    assert [row[2] for row in listed] == ["info", "critical", "info", "warning"]
    assert unlisted == 0


def test_long_list_keeps_every_warning_and_the_earliest_info():
    severities = ["info"] * 30 + ["warning"] * 5 + ["info"] * 10
    listed, unlisted = _listed(_found(severities))
    assert len(listed) == LISTED_AT_MOST
    assert sum(row[2] == "warning" for row in listed) == 5
    assert [row[0] for row in listed if row[2] == "info"] == list(range(LISTED_AT_MOST - 5))
    assert unlisted == 45 - LISTED_AT_MOST


def test_report_shows_the_injected_loss_spike_found_at_info(tmp_path):
    report = run_demo(str(tmp_path / "demo.db"), steps=3000, name="demo-report")
    (spike_step,) = [f.step for f in describe_faults(3000) if f.kind == "loss_spike"]
    spikes = [
        row
        for row in report.anomalies
        if row[3] == "spike" and row[4] == "loss" and row[0] <= spike_step <= row[1]
    ]
    assert spikes and spikes[0][2] == "info"
    with open_store(report.db) as store:
        severities = store.anomalies(report.run, source="live")["severity"]
    text = str(report)
    assert f"{int((severities != 'info').sum())} anomalies of warning or worse" in text
    assert f"and {int((severities == 'info').sum())} info:" in text
    assert "runwatch dashboard --db" in text
    # Grouped by cause: the NaN in the loss and the Inf in the grad norm at one step are one
    # incident, the slowdown seen by step time and tokens/s another, the crash a third.
    assert f"grouped by cause into {len(report.incidents)} incidents:" in text
    assert len(report.incidents) < len(severities)
    nan = [i for i in report.incidents if "non-finite" in i[2]]
    assert len(nan) == 1 and nan[0][:2] == ("critical", 2)
    slow = [i for i in report.incidents if "slowdown" in i[2]]
    assert len(slow) == 1 and slow[0][1] == 2 and "tokens_per_s" in slow[0][2]
    assert sum(i[2].startswith("crash") for i in report.incidents) == 1
