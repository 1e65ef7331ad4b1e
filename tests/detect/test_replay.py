"""Replay (``analyze_frame``) gives exactly what the streaming Monitor gives."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from runwatch.detect import Monitor, analyze_frame

from .conftest import canon, loss_curve, real_run


def stream(points: pd.DataFrame) -> Monitor:
    """Feed a Monitor row by row in the documented replay order (stable by step)."""
    m = Monitor()
    ordered = points.iloc[np.argsort(points["step"].to_numpy(), kind="stable")]
    for row in ordered.itertuples(index=False):
        labels = {
            k: getattr(row, k)
            for k in ("rank", "host", "gpu")
            if hasattr(row, k) and not pd.isna(getattr(row, k))
        }
        t = getattr(row, "time", None)
        m.update(row.metric, labels, int(row.step), float(row.value), t)
    m.finish()
    return m


@pytest.mark.parametrize("run", ["mng_llmc_gpt2_124m", "mlm_mixtral_8x7b_h100", "mng_soap_6k"])
def test_replay_equals_streaming_on_real_runs(run):
    df = real_run(run)
    assert canon(analyze_frame(df)) == canon(stream(df).anomalies)


def test_replay_equals_streaming_with_labels_faults_and_shuffled_rows():
    rng = np.random.default_rng(1)
    frames = []
    for rank in (0, 1):
        v = loss_curve(1500, seed=rank)
        v[700 + rank] = math.nan
        v[900:905] *= 2.5
        frames.append(
            pd.DataFrame(
                {"metric": "loss", "step": np.arange(1500), "value": v, "rank": float(rank)}
            )
        )
    st = np.exp(0.01 * rng.standard_normal(1500))
    st[1000:] *= 1.2
    frames.append(
        pd.DataFrame({"metric": "step_time", "step": np.arange(1500), "value": st, "rank": np.nan})
    )
    df = pd.concat(frames, ignore_index=True)
    df["time"] = df["step"] * 0.5
    df = df.sample(frac=1.0, random_state=3)  # arrival order differs from step order
    got = analyze_frame(df)
    assert canon(got) == canon(stream(df).anomalies)
    kinds = {(a.detector, a.labels.get("rank")) for a in got}
    assert {("nonfinite", 0), ("nonfinite", 1), ("regression", None)} <= kinds


def test_restart_event_in_replay_lets_redone_steps_through():
    v = loss_curve(1000, seed=5)
    first = pd.DataFrame({"metric": "loss", "step": np.arange(0, 700), "value": v[:700]})
    redo = pd.DataFrame({"metric": "loss", "step": np.arange(500, 1000), "value": v[500:]})
    events = pd.DataFrame({"kind": ["restart"], "step": [500], "time": [0.0]})
    m = Monitor()
    analyze_frame(pd.concat([first, redo]), events, monitor=m)
    assert m.health["out_of_order_points"] == 0


@pytest.mark.parametrize(
    "values",
    [[], [2.0], [math.nan] * 100, [3.0] * 2000],
    ids=["empty", "one_point", "all_nan", "constant"],
)
def test_bad_input_frames(values):
    df = pd.DataFrame({"metric": "loss", "step": np.arange(len(values)), "value": values})
    got = analyze_frame(df)
    if values and all(math.isnan(v) for v in values):
        assert [(a.detector, a.start_step, a.end_step) for a in got] == [("nonfinite", 0, 99)]
    else:
        assert got == []


def test_huge_step_gaps_do_not_alarm_on_a_clean_curve():
    v = loss_curve(3000, seed=8)
    steps = np.concatenate([np.arange(1500), 10**7 + np.arange(1500)])
    got = analyze_frame(pd.DataFrame({"metric": "loss", "step": steps, "value": v}))
    assert [a for a in got if a.severity != "info"] == []


def scenario_frame() -> pd.DataFrame:
    """Four metrics on two ranks with every kind of fault, rows in arrival order."""
    from .test_monitor import scenario

    loss, gn, st, lr = scenario()
    n = loss.size
    parts = []
    for rank in (0, 1):
        for name, v in (("grad_norm", gn), ("loss", loss), ("step_time", st), ("lr", lr)):
            parts.append(
                pd.DataFrame(
                    {
                        "metric": name,
                        "step": np.arange(n),
                        "value": v * (1 + 0.001 * rank),
                        "rank": rank,
                        "row": np.arange(n) * 8 + len(parts),
                    }
                )
            )
    parts.append(
        pd.DataFrame(
            {
                "metric": "gpu_mem",
                "step": np.arange(n),
                "value": np.where(np.arange(n) % 700 == 3, np.nan, 1.0),
                "rank": None,
                "row": np.arange(n) * 8 + 9,
            }
        )
    )
    return pd.concat(parts).sort_values("row", kind="stable").drop(columns="row")


@pytest.mark.parametrize("max_anomalies", [10_000, 7])
def test_batch_replay_equals_streaming_replay(max_anomalies):
    df = scenario_frame()
    fast, slow = Monitor(max_anomalies=max_anomalies), Monitor(max_anomalies=max_anomalies)
    a = analyze_frame(df, monitor=fast)
    b = analyze_frame(df, monitor=slow, fast=False)
    assert canon(a) == canon(b)
    assert len(a) == min(max_anomalies, len(canon(analyze_frame(df, fast=False))))
    assert fast.health == slow.health
    assert any(x.detector == "grad_norm_precursor" for x in analyze_frame(df))


@pytest.mark.parametrize(
    "run", ["mlm_dsv3_proxy_h100", "mng_llmc_gpt2_124m", "dschat_rlhf_opt1.3b"]
)
def test_batch_replay_equals_streaming_on_real_runs(run):
    df = real_run(run)
    fast, slow = Monitor(), Monitor()
    assert canon(analyze_frame(df, monitor=fast)) == canon(
        analyze_frame(df, monitor=slow, fast=False)
    )
    assert fast.health == slow.health


def test_reference_mode_replay_equals_streaming():
    from runwatch.expect import ReferenceCurve

    n = 5000
    s = np.arange(1, n + 1)
    ref = ReferenceCurve(s, 2.0 + 8.0 * (s + 20.0) ** -0.4)
    loss = loss_curve(n, seed=2)
    loss[2500:] *= 1.05  # worse than the known-good run from step 2501
    pts = pd.DataFrame({"metric": "loss", "step": s, "value": loss})
    fast = analyze_frame(pts, monitor=Monitor(references={"loss": ref}))
    slow = analyze_frame(pts, monitor=Monitor(references={"loss": ref}), fast=False)
    assert canon(fast) == canon(slow)
    assert any(a.detector == "curve_deviation" for a in fast)
