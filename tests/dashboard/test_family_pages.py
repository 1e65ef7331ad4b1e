"""The family on the Run and Compare pages, under Streamlit's AppTest, on a real SQLite store
filled through the CLI: `runwatch import --config` of law-following runs, then
`runwatch forecast --family` to store the target's family curve."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from runwatch.cli import main
from runwatch.dashboard import DB_ENV
from runwatch.expect.lrlaw import lr_areas
from runwatch.expect.planned import planned_lr
from runwatch.store import open_store

from .conftest import APP_DIR

TIMEOUT = 60
COSINE = {"name": "cosine", "warmup": 50, "final_lr_fraction": 0.1}
TOTAL = 2000
FAMILY = (("s", 1e5), ("m", 3e5), ("l", 1e6))


def run_csv(path: Path, run: str, params: float, *, worse: float = 1.0, upto: int = TOTAL) -> Path:
    """A run on the family law (loss and lr every 5 steps to ``upto``), ``worse`` times it."""
    steps, share = planned_lr(COSINE, TOTAL)
    s1, s2 = lr_areas(steps, share, TOTAL)
    loss = worse * (2.0 * (params / 1e6) ** -0.07 + 3.0 * np.maximum(s1, 1) ** -0.5 - 4e-4 * s2)
    rows = ["run,step,metric,value"]
    for s in range(1, upto + 1, 5):
        rows.append(f"{run},{s},loss,{loss[s]:.6f}")
        rows.append(f"{run},{s},lr,{3e-3 * share[s]:.8f}")
    path.write_text("\n".join(rows) + "\n")
    return path


def _import(db: Path, src: Path, config: dict) -> None:
    assert main(["import", str(src), "--db", str(db), "--config", json.dumps(config)]) == 0


@pytest.fixture(scope="module")
def family_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """s, m, l finished on the law; xl (3e6 params, 15% worse than its size predicts) at
    step 796 of 2000, its config naming its family and its family curve stored; "lone"
    (params, no family) and "noparams" (no params at all)."""
    tmp = tmp_path_factory.mktemp("family")
    db = tmp / "family.db"
    for name, params in FAMILY:
        src = run_csv(tmp / f"{name}.csv", name, params)
        _import(db, src, {"params": params, "total_steps": TOTAL, "schedule": COSINE})
    _import(db, run_csv(tmp / "np.csv", "noparams", 1e5), {"total_steps": TOTAL})
    _import(
        db,
        run_csv(tmp / "lone.csv", "lone", 2e6, upto=600),
        {"params": 2e6, "total_steps": TOTAL, "schedule": COSINE, "family": ["s", "noparams"]},
    )
    config = {"params": 3e6, "total_steps": TOTAL, "schedule": COSINE, "family": ["s", "m", "l"]}
    _import(db, run_csv(tmp / "xl.csv", "xl", 3e6, worse=1.15, upto=800), config)
    argv = ["forecast", "--db", str(db), "--run", "xl", "--family", "s", "m", "l"]
    assert main([*argv, "--format", "json"]) == 0
    return db


def _page(path: str, db: Path, monkeypatch: pytest.MonkeyPatch, run: str | None = None):
    monkeypatch.setenv(DB_ENV, str(db))
    at = AppTest.from_file(str(APP_DIR / path), default_timeout=TIMEOUT)
    if run is not None:
        at.query_params["run"] = run
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _figures(at: AppTest) -> list[dict]:
    return [json.loads(el.proto.spec) for el in at.get("plotly_chart")]


def _arr(value: object) -> np.ndarray:
    """A trace array from the figure JSON (plotly sends numpy arrays as base64 'bdata')."""
    import base64

    if isinstance(value, dict) and "bdata" in value:
        return np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
    return np.asarray(value)


def test_run_page_draws_the_family_curve_from_step_one_and_names_the_family(
    family_db, monkeypatch
) -> None:
    at = _page("views/run.py", family_db, monkeypatch, run="xl")
    (fig,) = _figures(at)
    by_name = {t.get("name"): t for t in fig["data"]}
    assert "expected (family)" in by_name and "expected" not in by_name
    line = by_name["expected (family)"]
    steps, values = _arr(line["x"]).astype(float), _arr(line["y"]).astype(float)
    # Over the whole run, from step 1 (the run logged to 796), on to the planned end.
    assert steps.min() == 1 and steps.max() == TOTAL
    with open_store(family_db, readonly=True) as store:
        meta, stored = store.expected_curve("xl", "loss")
    assert meta["model"] == "family"
    assert np.allclose(values, stored.sort_values("step")["expected"].to_numpy())
    band = by_name["expected band (90%)"]
    assert _arr(band["x"]).astype(float).min() == 1
    captions = [c.value for c in at.caption]
    assert "Expected curve from the family: s, m, l" in captions


def test_a_zoomed_run_page_draws_the_family_curve_in_the_window(family_db, monkeypatch) -> None:
    at = _page("views/run.py", family_db, monkeypatch, run="xl")
    at.slider(key="window-xl").set_value((200, 500)).run()
    assert not at.exception
    (fig,) = _figures(at)
    line = next(t for t in fig["data"] if t.get("name") == "expected (family)")
    steps = _arr(line["x"]).astype(float)
    assert steps.min() >= 200 and steps.max() <= 500


def test_a_run_without_a_family_curve_keeps_its_own_expected_curve(family_db, monkeypatch) -> None:
    at = _page("views/run.py", family_db, monkeypatch, run="lone")
    (fig,) = _figures(at)
    names = {t.get("name") for t in fig["data"]}
    assert "expected" in names and "expected (family)" not in names
    assert not any(c.value.startswith("Expected curve from the family") for c in at.caption)


def test_compare_places_the_run_against_its_family_line(family_db, monkeypatch) -> None:
    at = _page("views/compare.py", family_db, monkeypatch)
    assert at.selectbox(key="fam_run").value == "xl"  # its config lists its family
    assert at.multiselect(key="fam_of-xl").value == ["s", "m", "l"]
    fig = _figures(at)[-1]
    by_name = {t.get("name"): t for t in fig["data"]}
    assert fig["layout"]["xaxis"]["type"] == "log" and fig["layout"]["yaxis"]["type"] == "log"
    runs = by_name["family runs (final)"]
    assert list(runs["text"]) == ["s", "m", "l"]
    assert _arr(runs["x"]).astype(float).tolist() == [p for _, p in FAMILY]
    assert {"family law", "family law band (90%)", "xl forecast"} <= set(by_name)
    point = by_name["xl forecast"]
    assert _arr(point["x"]).astype(float).tolist() == [3e6]
    assert point["error_y"]["array"][0] > 0 and point["error_y"]["arrayminus"][0] > 0
    # xl was made 15% worse than the law at its size: above the line, by about that much.
    assert any("above the line" in m.value for m in at.markdown)
    card = next(m for m in at.metric if m.label == "xl: forecast final loss")
    off = float(card.delta.split("%")[0]) / 100
    assert 0.12 < off < 0.18


def test_compare_says_why_a_family_cannot_be_fitted(family_db, monkeypatch) -> None:
    at = _page("views/compare.py", family_db, monkeypatch)
    at.selectbox(key="fam_run").set_value("lone").run()
    assert not at.exception
    assert at.multiselect(key="fam_of-lone").value == ["s", "noparams"]
    infos = [i.value for i in at.info]
    assert any("family run 'noparams' has no params" in v for v in infos), infos
    assert not [f for f in _figures(at) if "family law" in {t.get("name") for t in f["data"]}]
    at.multiselect(key="fam_of-lone").set_value(["s", "m"]).run()
    assert not at.exception
    fig = _figures(at)[-1]
    assert "lone forecast" in {t.get("name") for t in fig["data"]}


def test_compare_asks_for_a_family_when_the_run_names_none(family_db, monkeypatch) -> None:
    at = _page("views/compare.py", family_db, monkeypatch)
    at.selectbox(key="fam_run").set_value("m").run()
    assert not at.exception
    assert at.multiselect(key="fam_of-m").value == []
    assert any("Pick the runs of m's family" in i.value for i in at.info)
