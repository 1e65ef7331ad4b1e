"""Issue 18's figures: family and schedule-transfer forecasts, and honest bands.

    python bench/forecast_family.py [--quick]

Every forecast goes through the product's path: the runs are imported into a SQLite store
with their config (``import --config``) and forecast by ``forecast_run`` (what
``runwatch forecast --family`` runs), at 0 (before the run starts) and 25% of the
target's steps. The anchors run in the same process on the same data: naive fits of the
family's final losses over size (a log-log line; a Chinchilla-form E + A·N^-a with three or
more sizes), the next size down's late-to-25% loss ratio, ``--reference`` with the next size
down (or the same size's short cosine), and the run alone (``forecast`` on its own points).

Data: ``shared/data/real_families`` (27 real runs, 3 sizes x 9 schedules),
and the real CPU runs on five tasks in ``bench/data/cpu_families``, ``cpu_code_families``,
``cpu_man_families``, ``cpu_perl_families`` and ``cpu_c_families``, made by
``bench/data/make_families.py``: the manual-page family after the forecast was built, the
Perl family after the size laws' regime was set, the C family after the line was left out
of the size laws' mean, each to test what came before it.
The single-run band coverage is measured on ``shared/data/real_runs`` and the CPU runs.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import curve_fit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from forecast_bands import CPU_SETS  # noqa: E402  (label: folder of real CPU runs)

from runwatch.collectors.importer import import_long_format  # noqa: E402
from runwatch.expect.family import level_offset  # noqa: E402
from runwatch.expect.forecast import Forecast  # noqa: E402
from runwatch.pipeline.analysis import forecast_run  # noqa: E402
from runwatch.store import open_store  # noqa: E402

REAL = ROOT.parent / "shared" / "data" / "real_families"
FRACTIONS = (0.0, 0.1, 0.25, 0.5, 0.75)
"""Where the target is forecast: before it starts and with its points to 25% (the issue's
figures), and to 10%, 50% and 75% (the band at every fraction; how the forecast goes on
with more of the run)."""
LEVEL_AT = (0.1, 0.25, 0.5, 0.75)
"""Where the run's level against its forecast before the start is read, in hindsight."""
REAL_SCHEDULES = (
    "cosine_24000",
    "constant_24000",
    "cosine_72000",
    "constant_72000",
    "wsd_20000_24000",
    "wsdld_20000_24000",
)
REAL_FIT_SET = ("cosine_24000", "constant_24000", "wsdcon_9")
"""The paper's fit set: the runs of each size that the family holds."""
REAL_SIZES = {"25m": 25e6, "100m": 100e6, "400m": 400e6}
_WARM = {"warmup": 2160}
REAL_PLANS = {
    "cosine_24000": {"name": "cosine", "final_lr_fraction": 0.1, **_WARM},
    "cosine_72000": {"name": "cosine", "final_lr_fraction": 0.1, **_WARM},
    "constant_24000": {"name": "constant", **_WARM},
    "constant_72000": {"name": "constant", **_WARM},
    "wsd_20000_24000": {
        "name": "wsd",
        "decay_start": 20000,
        "decay_shape": "cosine",
        "final_lr_fraction": 0.1,
        **_WARM,
    },
    "wsdld_20000_24000": {
        "name": "wsd",
        "decay_start": 20000,
        "decay_shape": "linear",
        "final_lr_fraction": 0.1,
        **_WARM,
    },
}
for _stage in ("wsdcon_3", "wsdcon_9", "wsdcon_18"):
    REAL_PLANS[_stage] = {"name": "constant", **_WARM}
"""The real runs' schedules as a config gives them (their SOURCES.md and logged LR). The
two-stage ``wsdcon`` runs drop the LR once, which no schedule name says: their config
gives the warmup (which the files do not log) and their logged LR the rest; they are in
the family (the paper's fit set) and not forecast targets."""


def final_value(frame: pd.DataFrame, metric: str) -> float:
    """A run's final value: the median of its last five points of ``metric``."""
    g = frame[frame["metric"] == metric].sort_values("step")
    return float(np.median(g["value"].to_numpy(float)[-5:]))


class Bench:
    """One store with every run imported; forecasts and anchors per case."""

    def __init__(self, db: Path) -> None:
        self.store = open_store(str(db))
        self.frames: dict[str, pd.DataFrame] = {}
        self.configs: dict[str, dict] = {}
        self.families: dict[tuple[str, str], list[str]] = {}  # (kind, target): family

    def add(self, path: Path, name: str, config: dict) -> None:
        import_long_format(self.store, path, run_name=name, config=config)
        frame = pd.read_csv(path)
        self.frames[name] = frame
        self.configs[name] = config

    def truth(self, run: str, metric: str) -> float:
        return final_value(self.frames[run], metric)

    def case(self, kind, run, metric, family, frac, anchors) -> dict:
        final = self.configs[run]["total_steps"]
        upto = int(frac * final)
        truth = self.truth(run, metric)
        row = {"kind": kind, "target": run, "at": f"{frac:.0%}", "truth": truth}
        self.families[(kind, run)] = list(family)
        f = forecast_run(self.store, run, metric, upto=upto, family=family, save=False)
        row |= {
            "family": _err(f.predicted, truth),
            "covered": f.lower <= truth <= f.upper,
            "band": (f.upper - f.lower) / 2 / truth * 100,
        }
        if frac == 0:
            row |= self.levels(run, metric, f)
        for name, fn in anchors.items():
            try:
                row[name] = _err(fn(upto), truth)
            except (ValueError, RuntimeError) as exc:
                print(f"  {name} on {run} at {frac:.0%}: {exc}", file=sys.stderr)
                row[name] = math.nan
        return row

    def levels(self, run: str, metric: str, before: Forecast) -> dict[str, float]:
        """The run's log offset (%) from its forecast made before it started, measured on
        its points up to each of ``LEVEL_AT`` of its steps as the family forecast measures
        it: ``level10%``, ``level25%``, ..."""
        final = before.final_step
        g = self.frames[run]
        g = g[g["metric"] == metric]
        prior = before.curve(np.arange(final + 1))[0]
        steps, values = g["step"].to_numpy(float), g["value"].to_numpy(float)
        out = {}
        for at in LEVEL_AT:
            level = level_offset(prior, steps, values, int(at * final), 0.0)
            out[f"level{at:.0%}"] = math.nan if level is None else 100 * level[0]
        return out

    def alone(self, run, metric):
        def fn(upto):
            return forecast_run(self.store, run, metric, upto=upto, save=False).predicted

        return fn

    def reference(self, run, metric, ref):
        def fn(upto):
            return forecast_run(
                self.store, run, metric, upto=upto, reference=ref, save=False
            ).predicted

        return fn

    def ratio(self, run, metric, smaller):
        """The next size down's final-to-(value at ``upto``) ratio times the target's."""

        def fn(upto):
            own = self._at(run, metric, upto)
            return own * self.truth(smaller, metric) / self._at(smaller, metric, upto)

        return fn

    def _at(self, run, metric, upto):
        g = self.frames[run]
        g = g[(g["metric"] == metric) & (g["step"] <= upto) & (g["step"] >= 0.8 * upto)]
        if g.empty:
            raise ValueError(f"{run} has no {metric} near step {upto}")
        return float(np.median(g["value"]))

    def size_fits(self, run, metric, family):
        """Naive fits of the family's final values over params (the anchors)."""
        n = np.array([self.configs[m]["params"] for m in family])
        y = np.array([self.truth(m, metric) for m in family])
        target_n = self.configs[run]["params"]
        slope, icept = np.polyfit(np.log(n), np.log(y), 1)
        out = {"loglog": lambda upto: float(np.exp(icept + slope * np.log(target_n)))}
        if len(family) >= 3:

            def chinchilla(upto):
                f = lambda x, e, a, b: e + a * np.exp(-b * (x - np.log(n).min()))  # noqa: E731
                p, _ = curve_fit(
                    f,
                    np.log(n),
                    y,
                    p0=(y.min() * 0.8, y.max() - y.min() * 0.8, 0.3),
                    bounds=([0, 0, 0], [y.min(), np.inf, 5]),
                    maxfev=20000,
                )
                return float(f(np.log(target_n), *p))

            out["chinchilla"] = chinchilla
        return out


def _err(pred: float, truth: float) -> float:
    return (pred - truth) / truth * 100


def real_families(bench: Bench, quick: bool) -> list[dict]:
    meta = json.loads((REAL / "runs.json").read_text())
    for name in meta:
        size = name.split("_")[1]
        sched = name.split("_", 2)[2]
        last = meta[name]["last_step"]
        total = int(sched.rsplit("_", 1)[1]) if sched[-5:].isdigit() else last
        config = {"params": REAL_SIZES[size], "total_steps": total}
        if sched in REAL_PLANS:
            config["schedule"] = REAL_PLANS[sched]
        bench.add(REAL / f"{name}.csv", name, config)
    rows = []
    targets = REAL_SCHEDULES[:3] if quick else REAL_SCHEDULES
    family = [f"mpl_{s}_{x}" for s in ("25m", "100m") for x in REAL_FIT_SET]
    for sched in targets:
        run = f"mpl_400m_{sched}"
        same = [f"mpl_{s}_{sched}" for s in ("25m", "100m")]
        for frac in FRACTIONS:
            anchors = dict(bench.size_fits(run, "loss", same)) if frac == 0 else {}
            if frac:
                anchors |= {
                    "ratio": bench.ratio(run, "loss", same[-1]),
                    "reference": bench.reference(run, "loss", same[-1]),
                    "alone": bench.alone(run, "loss"),
                }
            rows.append(bench.case("real size", run, "loss", family, frac, anchors))
    for size in REAL_SIZES if not quick else ("100m",):
        family = [f"mpl_{size}_{x}" for x in REAL_FIT_SET]
        for sched in ("cosine_72000", "wsd_20000_24000", "wsdld_20000_24000", "constant_72000"):
            run = f"mpl_{size}_{sched}"
            for frac in FRACTIONS:
                anchors = {}
                if frac:
                    anchors = {
                        "reference": bench.reference(run, "loss", family[0]),
                        "alone": bench.alone(run, "loss"),
                    }
                rows.append(bench.case("real transfer", run, "loss", family, frac, anchors))
    return rows


def cpu_families(bench: Bench, label: str, folder: Path) -> list[dict]:
    meta = json.loads((folder / "runs.json").read_text())
    for name, config in meta.items():
        bench.add(next(folder.glob(f"{name}.csv*")), name, config)
    width_runs = {n: c for n, c in meta.items() if "_cosine_2000" in n}
    largest = max(c["params"] for c in width_runs.values())
    family = sorted(
        (n for n, c in width_runs.items() if c["params"] < largest),
        key=lambda n: (width_runs[n]["params"], n),
    )
    seed0 = [n for n in family if width_runs[n]["seed"] == 0]  # the naive fits: one per size
    rows = []
    for run in sorted(n for n, c in width_runs.items() if c["params"] == largest):
        for frac in FRACTIONS:
            anchors = dict(bench.size_fits(run, "val_loss", seed0)) if frac == 0 else {}
            if frac:
                anchors |= {
                    "ratio": bench.ratio(run, "val_loss", seed0[-1]),
                    "reference": bench.reference(run, "val_loss", seed0[-1]),
                    "alone": bench.alone(run, "val_loss"),
                }
            rows.append(bench.case(f"{label} size", run, "val_loss", family, frac, anchors))
    rows += inner_widths(bench, label, width_runs)
    constant = [n for n in meta if n.endswith("constant_4000")]
    if not constant:
        return rows
    mid = constant[0].rsplit("_", 2)[0]
    family = [f"{mid}_constant_4000", f"{mid}_cosine_2000"]
    for target in (f"{mid}_cosine_4000", f"{mid}_wsd_3200_4000"):
        if target not in meta:
            continue
        for frac in FRACTIONS:
            anchors = {}
            if frac:
                anchors = {
                    "reference": bench.reference(target, "val_loss", family[1]),
                    "alone": bench.alone(target, "val_loss"),
                }
            rows.append(bench.case(f"{label} transfer", target, "val_loss", family, frac, anchors))
    return rows


def inner_widths(bench: Bench, label: str, width_runs: dict[str, dict]) -> list[dict]:
    """A check beyond the largest width: each width from the fourth (the first whose family
    of smaller widths can tell size laws apart) to the second largest, from the widths
    below it, before it starts and at 25%."""
    sizes = sorted({c["params"] for c in width_runs.values()})
    rows = []
    for size in sizes[3:-1]:
        family = sorted(n for n, c in width_runs.items() if c["params"] < size)
        for run in sorted(n for n, c in width_runs.items() if c["params"] == size):
            for frac in FRACTIONS:
                rows.append(bench.case(f"{label} inner", run, "val_loss", family, frac, {}))
    return rows


def summary(rows: pd.DataFrame) -> pd.DataFrame:
    out = []
    cols = [
        c
        for c in rows.columns
        if c not in ("kind", "target", "at", "truth", "covered", "band")
        and not c.startswith("level")
    ]
    for (kind, at), g in rows.groupby(["kind", "at"], sort=False):
        rec = {"kind": kind, "at": at, "n": len(g)}
        for c in cols:
            v = g[c].abs().dropna()
            rec[f"{c} med|err|%"] = round(float(v.median()), 2) if len(v) else None
        rec["coverage"] = f"{int(g['covered'].sum())}/{len(g)}"
        rec["band ±%"] = round(float(g["band"].median()), 2)
        out.append(rec)
    return pd.DataFrame(out)


def pooled(rows: pd.DataFrame) -> pd.DataFrame:
    """The issue's figures as worded, one median over every family's forecasts of a kind
    (size or transfer; the inner widths are a check, not a figure), beside the median of
    the families' own medians, so that the family with the most runs does not decide."""
    named = rows[~rows["kind"].str.endswith("inner")].copy()
    named["figure"] = named["kind"].str.split().str[-1]
    named["error"] = named["family"].abs()
    out = []
    for (figure, at), g in named.groupby(["figure", "at"], sort=False):
        per_family = g.groupby("kind")["error"].median()
        out.append(
            {
                "figure": figure,
                "at": at,
                "n": len(g),
                "families": len(per_family),
                "med|err|% over forecasts": round(float(g["error"].median()), 2),
                "med of family medians %": round(float(per_family.median()), 2),
                "worst family %": round(float(per_family.max()), 2),
                "coverage": f"{int(g['covered'].sum())}/{len(g)}",
            }
        )
    return pd.DataFrame(out)


LEVEL_WEIGHTS = (0.0, 0.25, 0.5, 0.75, 1.0)


def level_weights(rows: pd.DataFrame) -> pd.DataFrame:
    """What a quarter of the run can tell, in hindsight: the median |error| of each kind's
    forecasts if the run's level at 25% (against its forecast before the start) were
    carried to the end with one weight w, beside the product's forecast at 25%. No w is
    chosen from this; it shows how far the 25% figure rests on the forecast before the
    start."""
    before = rows[rows["at"] == "0%"].set_index(["kind", "target"])
    at25 = rows[rows["at"] == "25%"].set_index(["kind", "target"])["family"]
    out = []
    for kind, g in before.groupby(level="kind", sort=False):
        rec = {"kind": kind, "n": len(g)}
        for w in LEVEL_WEIGHTS:
            err = ((1 + g["family"] / 100) * np.exp(w * g["level25%"] / 100) - 1) * 100
            rec[f"w={w:g}"] = round(float(err.abs().median()), 2)
        rec["product at 25%"] = round(float(at25.loc[kind].abs().median()), 2)
        out.append(rec)
    return pd.DataFrame(out)


def level_gaps(rows: pd.DataFrame) -> pd.DataFrame:
    """How far the level a forecast measures at each share of the run (its log offset from
    the forecast made before the start) is from where the run ends: the median |gap|, in
    log %, per kind. A level that has settled by 25% could be carried to the end; one that
    still moves by more than the goal cannot, whatever weight it is given."""
    before = rows[(rows["at"] == "0%") & ~rows["kind"].str.endswith("transfer")]
    out = []
    for kind, g in before.groupby("kind", sort=False):
        end = -100 * np.log1p(g["family"] / 100)  # the log offset the run ends at
        rec = {"kind": kind, "n": len(g), "|end|": round(float(end.abs().median()), 2)}
        for at in LEVEL_AT:
            gap = (g[f"level{at:.0%}"] - end).abs().dropna()
            rec[f"gap at {at:.0%}"] = round(float(gap.median()), 2) if len(gap) else None
        out.append(rec)
    return pd.DataFrame(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few real-family cases only")
    args = parser.parse_args()
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        bench = Bench(Path(tmp) / "families.db")
        rows = real_families(bench, args.quick)
        for label, folder in CPU_SETS.items():
            if (folder / "runs.json").exists():
                rows += cpu_families(bench, label, folder)
        bench.store.close()
    frame = pd.DataFrame(rows)
    pd.set_option("display.width", 200)
    pd.set_option("display.max_columns", 30)
    print(frame.round(2).to_string(index=False))
    print()
    print(summary(frame).to_string(index=False))
    print()
    print(pooled(frame).to_string(index=False))
    print("\nmedian |error| % at 25% if the level there were carried with weight w")
    print(level_weights(frame).to_string(index=False))
    print("\nmedian |level at f - level at the end|, log % (|end|: the forecast's own miss)")
    print(level_gaps(frame).to_string(index=False))
    issue_at = frame["at"].isin(["0%", "25%"])
    covered = frame["covered"].astype(bool)
    named = ~frame["kind"].str.endswith("inner")
    for label, these in (("at 0% and 25%", issue_at), ("at 10%, 50% and 75%", ~issue_at)):
        issue = f"{covered[named & these].sum()}/{(named & these).sum()}"
        every = f"{covered[these].sum()}/{these.sum()}"
        print(f"the family and transfer forecasts {label}: {issue} covered; with inner: {every}")
    print(f"\n({time.perf_counter() - began:.0f} s)")


if __name__ == "__main__":
    main()
