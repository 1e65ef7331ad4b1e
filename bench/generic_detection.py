"""Generic detection for metrics of no known role (issue 19, item 6): false alarms and recall.

    python bench/generic_detection.py

1. False alarms: every real run in shared/data/real_runs and the CPU runs in bench/data
   replayed with the default Monitor; the episodes of the generic detectors (``rise``,
   ``drop``) on the series whose role is ``other``, per 100,000 points of those series, by
   severity. These runs are healthy in those series (their documented faults are in loss,
   grad norm and throughput), so a warning here is a false alarm.
2. Recall on labelled public anomaly-benchmark series: the NAB series in bench/data/nab
   (bench/data/nab/SOURCES.md) fed as a metric named ``value`` (a name that says nothing:
   both directions). A window is caught when an episode starts inside it; delay is from the
   window's start; episodes starting outside every window are false alarms. Anchors in the
   same run: the code before (no detector but NaN), a rolling z-score (mean/std of the 30
   points before, |z| > 3) and the loss spike detector (``Spike()``, what declaring the
   metric a loss would give), and chance: as many episodes as runwatch's, at random places
   (NAB's windows are wide, so a detector that alarms often catches many by chance).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runwatch.detect import analyze_frame, role_of  # noqa: E402
from runwatch.detect.spike import Spike  # noqa: E402

REAL_RUNS = ROOT.parent / "shared/data/real_runs"
CPU_RUNS = [ROOT / "bench/data/cpu_families", ROOT / "bench/data/tiny_lm_clean"]
NAB = ROOT / "bench/data/nab"
GENERIC = ("rise", "drop")
QUIET = 5  # flagged points this far apart are one episode (the detectors' ``quiet``)


def _runs() -> list[tuple[str, pd.DataFrame]]:
    files = sorted(REAL_RUNS.glob("*.csv"))
    for d in CPU_RUNS:
        files += sorted(d.glob("*.csv.gz"))
    out = []
    for f in files:
        df = pd.read_csv(f)
        if "metric" not in df:
            continue
        out.append((f.name.split(".")[0], df))
    return out


def false_alarms() -> pd.DataFrame:
    rows = []
    for name, df in _runs():
        other = [m for m in df["metric"].unique() if role_of(m) == "other"]
        if not other:
            continue
        found = [a for a in analyze_frame(df) if a.detector in GENERIC]
        for metric in other:
            n = int((df["metric"] == metric).sum())
            mine = [a for a in found if a.metric == metric]
            rows.append(
                {
                    "run": name,
                    "metric": metric,
                    "points": n,
                    "info": sum(a.severity == "info" for a in mine),
                    "warning+": sum(a.severity != "info" for a in mine),
                }
            )
    return pd.DataFrame(rows)


def _episodes(flags: np.ndarray) -> list[int]:
    """Start indices of runs of flagged points, merged when at most ``QUIET`` apart."""
    starts, last = [], -(10**9)
    for i in np.flatnonzero(flags):
        if i - last > QUIET:
            starts.append(int(i))
        last = i
    return starts


def _zscore(v: np.ndarray, window: int = 30) -> list[int]:
    s = pd.Series(v)
    mean = s.rolling(window).mean().shift(1)
    std = s.rolling(window).std().shift(1)
    z = ((s - mean) / std).abs().to_numpy()
    return _episodes(np.nan_to_num(z, nan=0.0) > 3)


def _spike(v: np.ndarray) -> list[int]:
    flags = np.zeros(len(v), bool)
    for i, _sig in Spike().update_many(list(range(len(v))), v):
        flags[i] = True
    return _episodes(flags)


def _ours(v: np.ndarray) -> list[tuple[int, str]]:
    pts = pd.DataFrame({"metric": "value", "step": np.arange(len(v)), "value": v})
    return [(a.start_step, a.severity) for a in analyze_frame(pts) if a.detector in GENERIC]


def _chance(n: int, episodes: int, spans: list[tuple[int, int]], draws: int = 500) -> float:
    """Windows caught, on average, by ``episodes`` starts placed at random: the recall that
    wide windows give any detector that alarms this often."""
    rng = np.random.default_rng(0)
    caught = 0
    for _ in range(draws):
        starts = rng.integers(0, n, size=episodes)
        caught += sum(bool(((starts >= a) & (starts <= b)).any()) for a, b in spans)
    return caught / draws


def nab_recall() -> pd.DataFrame:
    windows = json.loads((NAB / "combined_windows.json").read_text())
    rows = []
    for key, wins in sorted(windows.items()):
        path = NAB / Path(key).name
        if not path.exists():
            continue
        df = pd.read_csv(path)
        stamps = pd.to_datetime(df["timestamp"])
        v = df["value"].to_numpy(float)
        spans = [
            (int(stamps.searchsorted(pd.Timestamp(a))), int(stamps.searchsorted(pd.Timestamp(b))))
            for a, b in wins
        ]
        ours = _ours(v)
        detectors = {
            "runwatch (default)": [s for s, _ in ours],
            "runwatch, warning+": [s for s, sev in ours if sev != "info"],
            "before (NaN only)": [],
            "rolling z-score": _zscore(v),
            "loss Spike()": _spike(v),
        }
        chance = _chance(len(v), len(ours), spans)
        for det, starts in detectors.items():
            inside = [any(a <= s <= b for a, b in spans) for s in starts]
            delays = [min((s - a for s in starts if a <= s <= b), default=None) for a, b in spans]
            rows.append(
                {
                    "series": path.stem,
                    "detector": det,
                    "points": len(v),
                    "windows": len(spans),
                    "caught": sum(d is not None for d in delays),
                    "delays": [d for d in delays if d is not None],
                    "false": len(inside) - sum(inside),
                }
            )
        rows.append(
            {
                "series": path.stem,
                "detector": "chance (as many, at random)",
                "points": len(v),
                "windows": len(spans),
                "caught": chance,
                "delays": [],
                "false": 0,
            }
        )
    return pd.DataFrame(rows)


def main() -> None:
    fa = false_alarms()
    print("## False alarms of generic detection on real runs' unknown-role series\n")
    print(fa.to_string(index=False))
    per = 1e5 / max(fa["points"].sum(), 1)
    print(
        f"\nTotal: {fa['points'].sum():,} points in {len(fa)} series; "
        f"warning+ {fa['warning+'].sum()} ({fa['warning+'].sum() * per:.1f} per 100k points), "
        f"info {fa['info'].sum()} ({fa['info'].sum() * per:.1f} per 100k)\n"
    )
    if not (NAB / "combined_windows.json").exists():
        print("(no NAB series in bench/data/nab: recall not measured)")
        return
    nab = nab_recall()
    print("## Recall on NAB's labelled series\n")
    summary = []
    for det, g in nab.groupby("detector", sort=False):
        delays = [d for ds in g["delays"] for d in ds]
        summary.append(
            {
                "detector": det,
                "windows caught": f"{g['caught'].sum():g}/{g['windows'].sum()}",
                "recall": round(g["caught"].sum() / g["windows"].sum(), 2),
                "median delay (points)": float(np.median(delays)) if delays else None,
                "false episodes per 100k points": round(
                    g["false"].sum() * 1e5 / g["points"].sum(), 1
                ),
            }
        )
    print(pd.DataFrame(summary).to_string(index=False))
    print()
    per_series = nab.pivot(index="series", columns="detector", values="caught")
    per_series.insert(0, "windows", nab.groupby("series")["windows"].first())
    print(per_series.to_string())


if __name__ == "__main__":
    main()
