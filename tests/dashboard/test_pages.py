"""Every page under Streamlit's AppTest, on real stores: content, errors, verdicts."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from runwatch.dashboard import DB_ENV, shaping
from runwatch.store import open_store

from .conftest import APP_DIR

TIMEOUT = 30


def _page(path: str, db: Path, monkeypatch: pytest.MonkeyPatch) -> AppTest:
    monkeypatch.setenv(DB_ENV, str(db))
    return AppTest.from_file(str(APP_DIR / path), default_timeout=TIMEOUT)


def _figures(at: AppTest) -> list[dict]:
    return [json.loads(el.proto.spec) for el in at.get("plotly_chart")]


def _arr(value: object) -> np.ndarray:
    """A trace array from the figure JSON (plotly sends numpy arrays as base64 'bdata')."""
    if isinstance(value, dict) and "bdata" in value:
        return np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
    return np.asarray(value)


def _no_traceback(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


def test_router_opens_on_the_runs_page_and_lists_the_demo_run(demo_db, monkeypatch) -> None:
    at = _page("app.py", demo_db, monkeypatch).run()
    _no_traceback(at)
    assert at.title[0].value == "Runs"
    table = at.dataframe[0].value
    assert table["run"].tolist() == ["demo-400"]
    assert table["health"].iloc[0] == "critical"  # the NaN, unjudged
    assert table["attempts"].iloc[0] == 2
    at.switch_page("views/anomalies.py").run()
    _no_traceback(at)
    assert at.title[0].value == "Anomalies"


def test_run_page_draws_loss_with_expectation_anomalies_and_restart(demo_db, monkeypatch) -> None:
    at = _page("views/run.py", demo_db, monkeypatch).run()
    _no_traceback(at)
    (fig,) = _figures(at)
    names = {t.get("name") for t in fig["data"]}
    assert {"loss", "expected", "expected band (90%)", "critical incident"} <= names
    assert "redone steps (lost work)" in names
    assert max(len(_arr(t.get("x", []))) for t in fig["data"]) <= 4000
    assert any("restart #2" in a.get("text", "") for a in fig["layout"]["annotations"])
    labels = [m.label for m in at.metric]
    assert "ETA" in labels and "Open incidents" in labels
    # The anomaly list under the chart: the NaN, as a red badge, on the loss.
    listed = next(m.value for m in at.markdown if m.value.startswith("| # | severity | detector"))
    assert any(
        ":red-badge[critical]" in row and "nonfinite" in row and "loss" in row
        for row in listed.splitlines()
    )


def test_run_page_first_look_title_first_age_without_arrow_focused_loss_no_info_clutter(
    demo_db, monkeypatch
) -> None:
    """What a person sees first (issue 17): the run's title at the top, the last point's
    age with no arrow, a loss panel that opens past its initial fall, and no info-level
    markers until asked for."""
    from streamlit.proto.Metric_pb2 import Metric

    at = _page("views/run.py", demo_db, monkeypatch).run()
    _no_traceback(at)
    first = next(iter(at.main.children.values()))
    assert first.type == "title" and first.value == "demo-400"
    assert not any("Rows of the anomaly" in c.value for c in at.caption)
    assert not any("Rows of the anomaly" in m.value for m in at.markdown)
    last = next(m for m in at.metric if m.label == "Last step")
    assert last.delta.endswith(" ago") and not last.delta.startswith("-")
    assert last.proto.direction == Metric.MetricDirection.NONE  # an age, not a change
    (fig,) = _figures(at)
    low, high = fig["layout"]["yaxis"]["range"]
    assert fig["layout"]["yaxis"]["autorange"] is False
    loss = next(t for t in fig["data"] if t.get("name") == "loss")
    steps, values = _arr(loss["x"]), _arr(loss["y"]).astype(float)
    assert np.nanmax(values) > high  # the initial fall is drawn, past the top edge
    later = values[(steps >= 100) & np.isfinite(values)]
    assert low < later.min() and later.max() < high  # the rest of the run is all in view
    names = {t.get("name") for t in fig["data"]}
    assert "info incident" not in names and "critical incident" in names
    with open_store(demo_db, readonly=True) as store:
        info = int((store.incidents()["severity"] == "info").sum())
    assert info > 0
    hidden = f"{info} info-level incident{'s' if info > 1 else ''} not drawn"
    assert any(hidden in c.value for c in at.caption)
    at.toggle(key="show_info").set_value(True).run()
    _no_traceback(at)
    (fig,) = _figures(at)
    assert "info incident" in {t.get("name") for t in fig["data"]}


def test_last_step_card_of_a_run_without_times_shows_no_age(tmp_path, monkeypatch) -> None:
    """A run imported without times has no age to show: no "- ago", no arrow."""
    db = tmp_path / "notime.db"
    with open_store(db) as store:
        run_id, attempt = store.start_run("no-times", now=None)
        s = np.arange(1, 301)
        sid = store.series_id(run_id, "loss")
        store.write(run_id, attempt, {sid: (s, np.full(300, np.nan), 3.0 + 7.0 / s)})
    at = _page("views/run.py", db, monkeypatch).run()
    _no_traceback(at)
    last = next(m for m in at.metric if m.label == "Last step")
    assert last.value == "300" and not last.delta


def test_no_page_has_a_bare_string_that_streamlit_would_write_to_it() -> None:
    """Streamlit's "magic" writes a bare string statement in a page script to the page
    (the stray caption above the Run page's title was a constant's docstring)."""
    import ast

    for path in [*sorted((APP_DIR / "views").glob("*.py")), APP_DIR / "app.py"]:
        body = ast.parse(path.read_text()).body
        strays = [
            node.lineno
            for node in body[1:]
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        ]
        assert not strays, f"{path.name}: bare strings at lines {strays}"


def test_run_page_axes_smoothing_and_zoom_window(demo_db, monkeypatch) -> None:
    at = _page("views/run.py", demo_db, monkeypatch).run()
    at.slider(key="smoothing").set_value(0.0)
    at.toggle(key="log_y").set_value(True)
    at.slider(key="window-demo-400").set_value((100, 200)).run()
    _no_traceback(at)
    (fig,) = _figures(at)
    loss = next(t for t in fig["data"] if t.get("name") == "loss")
    assert _arr(loss["x"]).min() >= 100 and _arr(loss["x"]).max() <= 200
    assert fig["layout"]["yaxis"]["type"] == "log"
    at.segmented_control(key="x_axis").set_value("tokens").run()
    _no_traceback(at)
    (fig,) = _figures(at)
    loss = next(t for t in fig["data"] if t.get("name") == "loss")
    assert _arr(loss["x"]).min() >= 100 * 2**19  # the demo's tokens per step, from its config


def test_unknown_run_in_the_url_is_a_message_not_a_traceback(demo_db, monkeypatch) -> None:
    at = _page("views/run.py", demo_db, monkeypatch)
    at.query_params["run"] = "no-such-run"
    at.run()
    _no_traceback(at)
    assert "no run named 'no-such-run'" in at.error[0].value
    assert "demo-400" in at.error[0].value


@pytest.mark.parametrize(
    "page", ["app.py", "views/run.py", "views/anomalies.py", "views/compare.py"]
)
def test_missing_store_shows_how_to_make_one(page, tmp_path, monkeypatch) -> None:
    at = _page(page, tmp_path / "nope.db", monkeypatch).run()
    _no_traceback(at)
    assert "no such store" in at.error[0].value
    assert "runwatch demo" in at.error[0].value


def test_corrupt_store_is_a_message(tmp_path, monkeypatch) -> None:
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"this is not sqlite" * 100)
    at = _page("views/runs.py", bad, monkeypatch).run()
    _no_traceback(at)
    assert "cannot open as a runwatch store" in at.error[0].value


def test_anomaly_inbox_context_and_benign_verdict_is_stored(fresh_demo_db, monkeypatch) -> None:
    at = _page("views/anomalies.py", fresh_demo_db, monkeypatch).run()
    _no_traceback(at)
    with open_store(fresh_demo_db, readonly=True) as store:
        unjudged = shaping.pick_source(store.anomalies())["verdict"].isna().sum()
    assert unjudged > 0
    own = f"{unjudged} with no verdict of their own"
    assert any(own in c.value for c in at.caption)
    assert at.selectbox[0].value is None  # nothing opened (and drawn) until asked for
    first = int(at.dataframe[0].value["id"].iloc[0])  # the worst unjudged one is listed first
    at.selectbox[0].set_value(first).run()
    with open_store(fresh_demo_db, readonly=True) as store:
        row = store.anomalies().set_index("id").loc[first]
    assert row["severity"] == "critical"
    fig = _figures(at)[-1]  # the incidents' small charts come first
    assert {"loss", "grad_norm", "lr"} <= {a["text"] for a in fig["layout"]["annotations"]}
    at.text_input(key=f"note-{first}").set_value("bad shard 17")
    at.button(key=f"benign-{first}").click().run()
    _no_traceback(at)
    with open_store(fresh_demo_db, readonly=True) as store:
        verdicts = store.verdicts(int(first))
    assert verdicts[["verdict", "note"]].values.tolist() == [["benign", "bad shard 17"]]
    own = f"{unjudged - 1} with no verdict of their own"
    assert any(own in c.value for c in at.caption)  # it receded


def test_anomaly_filters_narrow_the_inbox(demo_db, monkeypatch) -> None:
    at = _page("views/anomalies.py", demo_db, monkeypatch).run()
    at.multiselect(key="f_sev").set_value(["critical"]).run()
    _no_traceback(at)
    with open_store(demo_db, readonly=True) as store:
        incidents = store.incidents()
        anomalies = shaping.pick_source(store.anomalies())
    critical = int((incidents["severity"] == "critical").sum())
    assert critical < len(incidents)  # the filter leaves some out
    assert at.subheader[0].value == f"Inbox · {critical} open incidents"
    n = int((anomalies["severity"] == "critical").sum())
    assert any(f"{n} with no verdict of their own" in c.value for c in at.caption)
    assert set(at.dataframe[0].value["severity"]) == {"critical"}
    at.multiselect(key="f_sev").set_value(["warning", "info"]).run()
    _no_traceback(at)  # whatever the filters leave, even nothing, is a page


def test_compare_overlays_runs_and_fits_the_scaling_law(siblings_db, monkeypatch) -> None:
    at = _page("views/compare.py", siblings_db, monkeypatch).run()
    _no_traceback(at)
    overlay, scaling = _figures(at)
    assert {t["name"] for t in overlay["data"]} == {"size-0", "size-1", "size-2"}
    law = [t for t in scaling["data"] if t["name"].startswith("fit: L =")]
    assert len(law) == 1
    assert at.metric[0].label == "Fitted exponent b"
    at.segmented_control(key="cmp_axis").set_value("tokens").run()
    _no_traceback(at)
    overlay = _figures(at)[0]
    assert _arr(overlay["data"][0]["x"]).max() == 300 * 65536


def test_redone_steps_come_from_every_earlier_attempt_and_nothing_else(
    tmp_path, monkeypatch
) -> None:
    """Two crashes: attempt 1 redone from step 201, attempt 2 from 231. The panel's redone
    points must be exactly the store's superseded points (read another way, all attempts)."""
    from runwatch.dashboard import data

    db = tmp_path / "restarts.db"
    with open_store(db) as store:
        run_id, attempt = store.start_run("r", now=0.0)
        sid = store.series_id(run_id, "loss")

        def write(lo: int, hi: int, att: int) -> None:
            s = np.arange(lo, hi + 1)
            store.write(run_id, att, {sid: (s, s * 1.0, 10.0 * att + s / 1000)})

        write(1, 300, attempt)
        attempt = store.begin_attempt(run_id, 201, "restart", now=400.0)
        write(201, 250, attempt)
        attempt = store.begin_attempt(run_id, 231, "restart", now=500.0)
        write(231, 400, attempt)
        everything = store.read_series("r", "loss", all_attempts=True)
    monkeypatch.setenv(DB_ENV, str(db))
    view = data.series_view(str(db), "r", "loss", None, None, 0.0, 10_000)
    redone = view[view["superseded"]].sort_values(["attempt", "step"])
    expected = everything[everything["superseded"]].sort_values(["attempt", "step"])
    assert redone[["attempt", "step", "value"]].values.tolist() == (
        expected[["attempt", "step", "value"]].values.tolist()
    )
    assert set(redone["attempt"]) == {1, 2} and len(redone) == 100 + 20
    assert view.loc[~view["superseded"], "attempt"].eq(3).sum() == 400 - 230


def test_forecast_uses_the_stored_expected_curve_until_the_run_outgrows_it(
    tmp_path, monkeypatch
) -> None:
    """After ``runwatch analyze`` the page reads the stored curve instead of fitting; once
    the run has steps the curve was not fitted on, the page fits again."""
    from runwatch.dashboard import data
    from runwatch.pipeline.analysis import forecast_run

    from .conftest import write_run

    db = tmp_path / "analyzed.db"
    write_run(db, "a", 3000, {"steps": 4000, "params": 1e7})
    with open_store(db) as store:
        stored = forecast_run(store, "a", "loss")

    def no_fit(*args, **kwargs):
        raise AssertionError("fitted although a fresh expected curve is stored")

    monkeypatch.setattr(data, "forecast", no_fit)
    fc = data.loss_forecast(str(db), "a", "loss")
    assert fc is not None and fc["model"] == stored.model
    assert fc["final_step"] == 4000 and fc["last_step"] == 3000
    assert fc["predicted"] == pytest.approx(stored.predicted, rel=1e-3)
    assert fc["lower"] < fc["predicted"] < fc["upper"]
    assert fc["eta_seconds"] == pytest.approx(1000 * 0.5, rel=0.01)  # 0.5 s per step

    with open_store(db) as store:  # the run goes on past the stored fit
        run_id = store.run_id("a")
        s = np.arange(3001, 3101)
        store.write(
            run_id, 1, {store.series_id(run_id, "loss"): (s, 1000.0 + s * 0.5, 2.5 + 0 * s)}
        )
    data.downsampled.clear()
    data.loss_forecast.clear()
    with pytest.raises(AssertionError, match="fitted although"):
        data.loss_forecast(str(db), "a", "loss")
