"""`runwatch analyze` and `runwatch forecast`: JSON contracts, exit codes, stored results."""

from __future__ import annotations

import json

import numpy as np
import pytest

import runwatch
from runwatch.cli import main
from runwatch.store import open_store

ANALYZE_KEYS = {
    "run",
    "detector",
    "metric",
    "labels",
    "start_step",
    "end_step",
    "severity",
    "score",
    "observed",
    "expected",
    "lower",
    "upper",
    "message",
}
FORECAST_KEYS = {
    "run",
    "metric",
    "upto",
    "final_step",
    "predicted",
    "lower",
    "upper",
    "model",
    "eta_seconds",
}
# With timed points, the ETA allows for failures still to come (issue 18): its band and the
# goodput so far are added beside eta_seconds.
ETA_KEYS = {"eta_lower", "eta_upper", "goodput"}


def _log_curve(db_path, name="r", n=2000, nan_at=None, monitor=True, config=None):
    rng = np.random.default_rng(0)
    with runwatch.init(
        name=name, store=db_path, monitor=monitor, config=config, cpu_wait=False
    ) as run:
        for step in range(1, n + 1):
            loss = 2.0 + 8.0 * (step + 20.0) ** -0.4 + rng.normal(0, 0.01)
            if step == nan_at:
                loss = float("nan")
            run.log({"loss": loss}, step=step)


def test_analyze_json_lines_follow_the_contract_and_fail_on_sets_exit_code(db_path, capsys):
    _log_curve(db_path, nan_at=1500)
    assert (
        main(
            [
                "analyze",
                "--db",
                str(db_path),
                "--run",
                "r",
                "--format",
                "json",
                "--fail-on",
                "critical",
            ]
        )
        == 1
    )
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rows and all(set(row) == ANALYZE_KEYS for row in rows)
    nan = [r for r in rows if r["detector"] == "nonfinite"]
    assert len(nan) == 1 and nan[0]["start_step"] == 1500 and nan[0]["severity"] == "critical"


def test_analyze_of_a_clean_run_exits_0_and_says_so(db_path, capsys):
    _log_curve(db_path)
    assert main(["analyze", "--db", str(db_path), "--run", "r", "--fail-on", "warning"]) == 0


def test_analyze_stores_its_results_replacing_the_previous_replay(db_path, capsys):
    _log_curve(db_path, nan_at=1500, monitor=False)
    for _ in range(2):
        main(["analyze", "--db", str(db_path), "--run", "r"])
    with open_store(str(db_path)) as store:
        replay = store.anomalies("r", source="replay")
        meta, curve = store.expected_curve("r", "loss")
    assert (replay["detector"] == "nonfinite").sum() == 1
    assert meta["model"] and len(curve) > 100


def test_live_detection_finds_what_the_replay_finds(db_path, capsys):
    _log_curve(db_path, nan_at=1500)
    main(["analyze", "--db", str(db_path), "--run", "r"])
    with open_store(str(db_path)) as store:
        found = store.anomalies("r")
    columns = ["detector", "metric", "start_step", "end_step", "severity", "message"]
    live = found[found["source"] == "live"][columns].reset_index(drop=True)
    replay = found[found["source"] == "replay"][columns].reset_index(drop=True)
    assert len(live) >= 1
    assert live.equals(replay)


def test_analyze_rejects_bad_roles(db_path, capsys):
    _log_curve(db_path, n=50)
    assert main(["analyze", "--db", str(db_path), "--run", "r", "--roles", "{nope"]) == 2
    assert "--roles is not valid JSON" in capsys.readouterr().err


def test_forecast_json_contract_and_planned_final_step(db_path, capsys):
    _log_curve(db_path, config={"total_steps": 8000})
    assert (
        main(
            [
                "forecast",
                "--db",
                str(db_path),
                "--run",
                "r",
                "--metric",
                "loss",
                "--upto",
                "1000",
                "--format",
                "json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert set(out) == FORECAST_KEYS | ETA_KEYS
    assert (out["upto"], out["final_step"]) == (1000, 8000)
    truth = 2.0 + 8.0 * (8000 + 20.0) ** -0.4
    assert out["lower"] <= truth <= out["upper"]
    assert out["eta_seconds"] is not None and out["eta_seconds"] >= 0
    assert out["eta_lower"] <= out["eta_seconds"] <= out["eta_upper"]
    assert 0 < out["goodput"] <= 1


def test_forecast_table_and_errors(db_path, capsys):
    _log_curve(db_path)
    assert (
        main(
            [
                "forecast",
                "--db",
                str(db_path),
                "--run",
                "r",
                "--metric",
                "loss",
                "--final-step",
                "4000",
            ]
        )
        == 0
    )
    assert "at step 4000" in capsys.readouterr().out
    assert main(["forecast", "--db", str(db_path), "--run", "r", "--metric", "acc"]) == 2
    assert "has no metric 'acc'" in capsys.readouterr().err


@pytest.mark.parametrize("values", [[], [1.0], [float("nan")] * 50])
def test_forecast_with_too_little_data_is_a_clear_error(db_path, capsys, values):
    with runwatch.init(name="r", store=db_path, monitor=False) as run:
        run.log({"other": 1.0}, step=0)
        for step, v in enumerate(values, start=1):
            run.log({"loss": v}, step=step)
    assert main(["forecast", "--db", str(db_path), "--run", "r", "--metric", "loss"]) == 2
    err = capsys.readouterr().err
    assert "too little data" in err or "has no metric" in err


def test_analyze_names_the_slow_rank_of_an_imported_fleet(tmp_path, db_path, capsys):
    rng = np.random.default_rng(3)
    rows = ["run,step,metric,value,rank,host"]
    for step in range(400):
        common = 1.0 + 0.02 * rng.standard_normal()
        for rank in range(16):
            slow = 1.2 if rank == 5 and step >= 100 else 1.0
            value = common * slow * (1 + 0.01 * rng.standard_normal())
            rows.append(f"fleet,{step},step_time_s,{value:.5f},{rank},node{rank // 8}")
    src = tmp_path / "fleet.csv"
    src.write_text("\n".join(rows) + "\n")
    assert main(["import", str(src), "--db", str(db_path)]) == 0
    capsys.readouterr()
    main(["analyze", "--db", str(db_path), "--run", "fleet", "--format", "json"])
    found = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    accused = {row["labels"].get("rank") for row in found if "straggler" in row["detector"]}
    assert accused == {5}
    (row,) = [r for r in found if "straggler" in r["detector"]]
    assert row["labels"]["host"] == "node0" and row["start_step"] >= 100


def test_forecast_without_metric_forecasts_the_runs_loss(db_path, capsys):
    with runwatch.init(name="r", store=db_path, monitor=False) as run:
        for step in range(1, 2001):
            loss = 2.0 + 8.0 * (step + 20.0) ** -0.4
            run.log({"val_loss": loss + 0.1, "train_loss": loss, "grad_norm": 1.0}, step=step)
    assert main(["forecast", "--db", str(db_path), "--run", "r", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["metric"] == "train_loss"


def test_forecast_without_metric_on_a_run_with_no_loss_names_what_it_has(db_path, capsys):
    with runwatch.init(name="r", store=db_path, monitor=False) as run:
        run.log({"accuracy": 0.5, "grad_norm": 1.0}, step=1)
    assert main(["forecast", "--db", str(db_path), "--run", "r"]) == 2
    err = capsys.readouterr().err
    assert "no loss metric" in err and "accuracy, grad_norm" in err


def _log_law(db_path, name, n, *, offset=0.0, step_scale=1.0, config=None):
    """The same power law in tokens: a run with ``step_scale`` times the batch is at
    ``step * step_scale`` of the reference's steps."""
    rng = np.random.default_rng(1)
    with runwatch.init(name=name, store=db_path, monitor=False, config=config) as run:
        for step in range(1, n + 1):
            s = step * step_scale
            run.log({"loss": 2.0 + offset + 8.0 * (s + 20.0) ** -0.4 + rng.normal(0, 0.005)}, step)


def _forecast_json(capsys, *args) -> dict:
    assert main(["forecast", *args, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_forecast_against_a_reference_run_by_step(db_path, capsys):
    _log_law(db_path, "ref", 8000)
    _log_law(db_path, "new", 2000, offset=0.05)
    out = _forecast_json(capsys, "--db", str(db_path), "--run", "new", "--reference", "ref",
                         "--final-step", "8000")  # fmt: skip
    assert set(out) == FORECAST_KEYS | ETA_KEYS | {"reference", "align"}
    assert (out["model"], out["reference"], out["align"]) == ("reference", "ref", "step")
    truth = 2.05 + 8.0 * 8020.0**-0.4
    assert out["predicted"] == pytest.approx(truth, abs=0.01)
    assert out["lower"] <= truth <= out["upper"]
    with open_store(str(db_path)) as store:
        meta, curve = store.expected_curve("new", "loss")
    assert meta["model"] == "reference" and curve["step"].max() >= 8000


def test_forecast_against_a_reference_run_by_tokens(db_path, capsys):
    _log_law(db_path, "ref", 8000, config={"tokens_per_step": 2048})
    _log_law(db_path, "big", 2000, step_scale=2.0, config={"tokens_per_step": 4096})
    args = ["--db", str(db_path), "--run", "big", "--reference", "ref", "--final-step", "4000"]
    by_tokens = _forecast_json(capsys, *args, "--align", "tokens")
    truth = 2.0 + 8.0 * (8000 + 20.0) ** -0.4  # 4000 steps of twice the batch
    assert by_tokens["predicted"] == pytest.approx(truth, abs=0.01)
    by_step = _forecast_json(capsys, *args)
    assert abs(by_step["predicted"] - truth) > abs(by_tokens["predicted"] - truth)


def test_forecast_target_step(db_path, capsys):
    _log_law(db_path, "r", 3000)
    target = 2.0 + 8.0 * (4500 + 20.0) ** -0.4
    out = _forecast_json(capsys, "--db", str(db_path), "--run", "r", "--target", str(target))
    assert set(out) == FORECAST_KEYS | ETA_KEYS | {"target", "target_step"}
    assert out["target_step"] == pytest.approx(4500, rel=0.15)
    assert main(["forecast", "--db", str(db_path), "--run", "r", "--target", "1.0"]) == 0
    assert "does not reach 1" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--reference", "nope"], "nope"),
        (["--reference", "r"], "another run"),
        (["--reference", "other", "--align", "tokens"], "cannot align run"),
        (["--align", "tokens"], "--align needs --reference"),
    ],
)
def test_forecast_reference_errors_exit_2_with_the_reason(db_path, capsys, extra, message):
    _log_law(db_path, "r", 500)
    _log_law(db_path, "other", 500)
    assert main(["forecast", "--db", str(db_path), "--run", "r", *extra]) == 2
    assert message in capsys.readouterr().err


def test_analyze_against_a_reference_run_reports_a_run_worse_throughout(db_path, capsys):
    """A fit adapts to a run's own level; the reference mode says it is worse than the
    known-good run all along."""
    _log_law(db_path, "ref", 6000)
    _log_law(db_path, "worse", 6000, offset=0.06)
    args = ["analyze", "--db", str(db_path), "--run", "worse", "--format", "json"]

    def deviations() -> list[dict]:
        rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        return [r for r in rows if r["detector"] == "curve_deviation"]

    assert main(args) == 0
    assert deviations() == []
    assert main([*args, "--reference", "ref"]) == 0
    found = deviations()
    assert found and found[0]["severity"] == "warning" and "worse" in found[0]["message"]
    assert found[0]["expected"] == pytest.approx(found[0]["observed"] - 0.06, abs=0.03)
    with open_store(str(db_path)) as store:
        meta, _ = store.expected_curve("worse", "loss")
    assert meta["model"] == "reference"


def test_analyze_reference_errors_exit_2(db_path, capsys):
    _log_law(db_path, "r", 500)
    assert main(["analyze", "--db", str(db_path), "--run", "r", "--reference", "r"]) == 2
    assert "another run" in capsys.readouterr().err
    assert main(["analyze", "--db", str(db_path), "--run", "r", "--align", "tokens"]) == 2
    assert "--align needs --reference" in capsys.readouterr().err
    assert main(["analyze", "--db", str(db_path), "--run", "r", "--reference", "nope"]) == 2
    assert "nope" in capsys.readouterr().err


def test_forecast_table_says_how_the_logged_lr_was_carried_on(db_path, capsys):
    """A cosine schedule to step 4000, logged to step 2000: the table names the projection;
    --upto hides the LR after it too (an honest what-if), so at step 400 the decay is all
    still to come."""
    n, final = 2000, 4000
    steps = np.arange(1, n + 1)
    lr = 1e-3 * 0.5 * (1 + np.cos(np.pi * steps / final))
    area = np.cumsum(lr / 1e-3)
    loss = 2.0 + 8.0 * (area + 50.0) ** -0.3
    with runwatch.init(name="cos", store=db_path, config={"total_steps": final}) as run:
        for s, x, y in zip(steps.tolist(), lr.tolist(), loss.tolist(), strict=True):
            run.log({"loss": y, "lr": x}, step=s)
    assert main(["forecast", "--db", str(db_path), "--run", "cos"]) == 0
    out = capsys.readouterr().out
    assert f"the LR's cosine decay carried on to step {final}" in out
    assert main(["forecast", "--db", str(db_path), "--run", "cos", "--upto", "400"]) == 0
    assert "(power_law; the LR's cosine decay carried on to step 4000 is mostly still" in (
        capsys.readouterr().out
    )


@pytest.mark.parametrize("fast", [True, False])
def test_analyze_tells_its_progress_phase_by_phase_to_every_point(db_path, fast, monkeypatch):
    """What a long replay's progress bar is fed: the phases in order, the points replayed
    never going back, and all of them by the end (batch: after each series; streaming:
    every PROGRESS_EVERY rows)."""
    from runwatch.detect import replay
    from runwatch.pipeline.analysis import analyze_run

    monkeypatch.setattr(replay, "PROGRESS_EVERY", 300)
    if not fast:  # the batch path refuses; the streaming path replays every row
        monkeypatch.setattr(replay, "_batch", lambda *args: False)
    _log_curve(db_path, n=1000, monitor=False)
    with runwatch.init(name="r", store=db_path, resume=True, monitor=False, cpu_wait=False) as run:
        for step in range(1001, 1101):
            run.log({"grad_norm": 0.5}, step=step)
    calls: list[tuple[str, int, int]] = []
    with open_store(str(db_path)) as store:
        analyze_run(store, "r", progress=lambda *call: calls.append(call))
    phases = [phase for phase, _, _ in calls]
    assert phases[0] == "replaying" and phases[-2:] == ["cross-rank checks", "storing"]
    done = [d for phase, d, _ in calls if phase == "replaying"]
    assert done == sorted(done) and done[-1] == 1100 and len(done) >= 3
    assert {total for _, _, total in calls} == {1100}
