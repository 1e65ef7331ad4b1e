"""Live detection in family mode: ``runwatch.init(family=[...])``, in process and through a
server, judged from step 0 by what the recipe's earlier runs predict."""

from __future__ import annotations

import numpy as np
import pytest

import runwatch
from runwatch.expect.lrlaw import lr_areas
from runwatch.expect.planned import planned_lr
from runwatch.store import open_store

COSINE = {"name": "cosine", "warmup": 50, "final_lr_fraction": 0.1}
TOTAL = 3000


def log_run(name, params, worse=1.0, seed=0, **options) -> None:
    """A run whose loss follows one law over size and LR, ``worse`` times its size's."""
    steps, share = planned_lr(COSINE, TOTAL)
    s1, s2 = lr_areas(steps, share, TOTAL)
    level = 2.0 * (params / 1e6) ** -0.07
    loss = worse * (level + 3.0 * np.maximum(s1, 1) ** -0.5 - 4e-4 * s2)
    rng = np.random.default_rng(seed)
    config = {"params": params, "total_steps": TOTAL, "schedule": COSINE}
    with runwatch.init(name=name, config=config, cpu_wait=False, **options) as run:
        for step in range(1, TOTAL + 1):
            run.log({"loss": loss[step] + rng.normal(0, 0.003), "lr": 3e-3 * share[step]}, step)


def deviations(db, run):
    with open_store(str(db), readonly=True) as store:
        found = store.anomalies(run)
    return found[(found["source"] == "live") & (found["detector"] == "curve_deviation")]


@pytest.fixture
def family_db(db_path):
    for i, (name, params) in enumerate((("s", 1e5), ("m", 3e5), ("l", 1e6))):
        log_run(name, params, seed=i, store=db_path, monitor=False)
    return db_path


def test_a_run_above_its_scaling_line_is_flagged_live_and_one_on_it_is_not(family_db):
    log_run("on", 3e6, seed=7, store=family_db, family=["s", "m", "l"])
    log_run("above", 3e6, worse=1.15, seed=8, store=family_db, family=["s", "m", "l"])
    assert (deviations(family_db, "on")["severity"] != "warning").all()
    found = deviations(family_db, "above")
    assert (found["severity"] == "warning").any()
    assert found[found["severity"] == "warning"]["message"].str.contains("worse").all()
    with open_store(str(family_db), readonly=True) as store:
        config = store.runs().set_index("name").loc["above", "config"]
    assert '"family": ["s", "m", "l"]' in config  # the dashboard can name the family


@pytest.mark.parametrize(
    ("family", "config", "message"),
    [
        (["nope"], {"params": 3e6, "total_steps": TOTAL}, "nope"),
        (["s", "new"], {"params": 3e6, "total_steps": TOTAL}, "other runs than 'new'"),
        (["s", "m"], {"total_steps": TOTAL}, "no params"),
    ],
)
def test_a_bad_family_fails_init_before_anything_is_written(family_db, family, config, message):
    with pytest.raises((ValueError, LookupError), match=message):  # LookupError: no such run
        runwatch.init(name="new", config=config, store=family_db, family=family)
    with open_store(str(family_db)) as store:
        assert "new" not in set(store.runs()["name"])
