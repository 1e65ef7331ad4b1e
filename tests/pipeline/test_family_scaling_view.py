"""The Compare page's scaling view from a real SQLite store: the family law's band over
params reaches what each size law the family cannot rule out expects."""

from __future__ import annotations

import numpy as np
import pytest

from runwatch.collectors.importer import import_long_format
from runwatch.expect.family_fit import fit_family
from runwatch.expect.lrlaw import lr_areas
from runwatch.expect.planned import planned_lr
from runwatch.pipeline.family import family_curves, family_members, forecast_family, scaling_view
from runwatch.store import open_store

COSINE = {"name": "cosine", "warmup": 50, "final_lr_fraction": 0.1}
SIZES = (1e5, 2e5, 4e5, 8e5, 1.6e6)


def _import(store, tmp_path, name, params):
    """A run whose final loss is quadratic in log params, which none of the size laws is."""
    steps, share = planned_lr(COSINE, 2000)
    s1, s2 = lr_areas(steps, share, 2000)
    x = np.log(params / 1e4)
    loss = (1.5 - 0.15 * x + 0.01 * x * x) * (1.0 + 1.5 * np.maximum(s1, 1) ** -0.5 - 2e-4 * s2)
    noise = np.random.default_rng(len(name) + int(params) % 97).normal(0, 0.002, loss.size)
    rows = ["run,step,metric,value"]
    for s in range(1, 2001, 5):
        rows += [
            f"{name},{s},loss,{loss[s] + noise[s]:.6f}",
            f"{name},{s},lr,{3e-3 * share[s]:.8f}",
        ]
    path = tmp_path / f"{name}.csv"
    path.write_text("\n".join(rows) + "\n")
    config = {"params": params, "total_steps": 2000, "schedule": COSINE}
    import_long_format(store, path, run_name=name, config=config)


def test_the_scaling_view_band_reaches_each_size_law_not_ruled_out(tmp_path):
    with open_store(str(tmp_path / "fam.db")) as store:
        names = [f"n{i}" for i in range(len(SIZES))]
        for name, params in zip(names, SIZES, strict=True):
            _import(store, tmp_path, name, params)
        _import(store, tmp_path, "target", 4e6)
        fit = fit_family(family_members(store, names, "loss"))
        assert fit.size_laws_alike
        view = scaling_view(store, "target", "loss", names)
    steps, share = planned_lr(COSINE, 2000)
    params = np.array([row[0] for row in view["law"]])
    lower = np.array([row[2] for row in view["law"]])
    upper = np.array([row[3] for row in view["law"]])
    half = np.array([fit.half_width(p) for p in params])
    for law in fit.size_laws:  # each with the chosen law's band around it
        ends = fit.final_by_size(params, steps, share, 2000, law)
        assert (lower <= ends * np.exp(-half) * 1.0001).all()
        assert (ends * np.exp(half) <= upper * 1.0001).all()
    # The line is the laws' weighted mean, as the forecast's is.
    ends = [fit.final_by_size(params, steps, share, 2000, law) for law in fit.size_laws]
    mean = np.array([row[1] for row in view["law"]])
    np.testing.assert_allclose(mean, np.array(fit.size_law_weights) @ np.array(ends), rtol=1e-9)


def test_the_detectors_family_margin_is_the_widest_upper_end_where_it_judges(tmp_path):
    # The size laws' curves part most in the first steps, where the detector does not
    # judge a run (before its family's fit starts): its margin is the band's widest upper
    # end from there on, not wider.
    with open_store(str(tmp_path / "fam.db")) as store:
        names = [f"n{i}" for i in range(len(SIZES))]
        for name, params in zip(names, SIZES, strict=True):
            _import(store, tmp_path, name, params)
        config = {"params": 6.4e6, "total_steps": 2000, "schedule": COSINE}
        ref = family_curves(store, names, "big", ["loss"], config=config)["loss"]
        fc = forecast_family(store, "big", "loss", names, upto=0, config=config)
    steps = np.arange(1.0, 2001.0)
    mean, _, upper = fc.curve(steps)
    judged = steps >= ref.first_step
    assert ref.rel_band == pytest.approx(np.max(upper[judged] / mean[judged] - 1), rel=0.02)
    assert ref.rel_band < 0.9 * np.max(upper / mean - 1)
