"""Live detection in reference mode: ``runwatch.init(reference="RUN")``."""

from __future__ import annotations

import numpy as np
import pytest

import runwatch
from runwatch.store import open_store


def _log(db_path, name, offset=0.0, **options) -> None:
    rng = np.random.default_rng(2)
    with runwatch.init(name=name, store=db_path, **options) as run:
        for step in range(1, 5001):
            loss = 2.0 + offset + 8.0 * (step + 20.0) ** -0.4 + rng.normal(0, 0.005)
            run.log({"loss": loss}, step=step)


def _live_deviations(db_path, run: str):
    with open_store(str(db_path)) as store:
        found = store.anomalies(run)
    live = found[(found["source"] == "live") & (found["detector"] == "curve_deviation")]
    return live


def test_a_run_worse_than_its_reference_is_flagged_live(db_path):
    _log(db_path, "baseline", monitor=False)
    _log(db_path, "plain", offset=0.06)
    _log(db_path, "versus", offset=0.06, reference="baseline")
    assert _live_deviations(db_path, "plain").empty  # a fit adapts to the run's own level
    found = _live_deviations(db_path, "versus")
    assert not found.empty
    assert (found["severity"] == "warning").any()
    assert found["message"].str.contains("worse").all()


@pytest.mark.parametrize(("reference", "message"), [("nope", "nope"), ("same", "another run")])
def test_a_bad_reference_fails_init_before_anything_is_written(db_path, reference, message):
    _log(db_path, "baseline", monitor=False)
    with pytest.raises(Exception, match=message):
        runwatch.init(name="same", store=db_path, reference=reference)
    with open_store(str(db_path)) as store:
        assert "same" not in set(store.runs()["name"])


def test_reference_mode_without_live_detection_is_refused_by_name(db_path):
    _log(db_path, "baseline", monitor=False)
    with pytest.raises(ValueError, match="monitor=False"):
        runwatch.init(name="off", store=db_path, reference="baseline", monitor=False)
    with open_store(str(db_path)) as store:
        assert set(store.runs()["name"]) == {"baseline"}
