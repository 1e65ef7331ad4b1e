"""The LR-area law's fit: the compiled solver must fit at least as well as scipy's."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import least_squares

from runwatch.expect import AreaLaw, fit_area_law, lr_areas


def _schedule(kind: str, n: int) -> np.ndarray:
    s = np.arange(n)
    warm = np.minimum((s + 1) / 200, 1.0)
    if kind == "cosine":
        return 3e-4 * warm * (0.55 + 0.45 * np.cos(np.pi * s / n))
    if kind == "wsd":
        return 3e-4 * warm * np.where(s < 0.8 * n, 1.0, 1.0 - (s - 0.8 * n) / (0.2 * n))
    return 3e-4 * warm  # constant: no anneal, C cannot be told apart and stays 0


def _soft_l1(law: AreaLaw, s1, s2, y, f: float) -> float:
    r = law.predict_areas(s1, s2) - y
    return float(f * f * np.sum(np.sqrt(1.0 + (r / f) ** 2) - 1.0))


def _scipy_fit(s1, s2, y, f: float) -> AreaLaw:
    """The same problem through scipy's trust-region solver."""
    top, s2max = float(s1.max()), max(float(np.abs(s2).max()), 1e-300)
    x, z = s1 / top, s2 / s2max
    span = float(np.ptp(y))
    r = least_squares(
        lambda p: p[0] + p[1] * x ** -p[2] - p[3] * z - y,
        [max(float(y.min()) - 0.5 * span, 1e-9), 0.5 * span, 0.5, 0.0],
        bounds=([0.0, 0.0, 0.02, 0.0], [float(y.max()), np.inf, 3.0, np.inf]),
        loss="soft_l1",
        f_scale=f,
        max_nfev=2000,
    )
    e, a, alpha, c = r.x
    return AreaLaw(e, a * top**alpha, alpha, c / s2max, 0.0, y.size)


@pytest.mark.parametrize("kind", ["cosine", "wsd", "constant"])
@pytest.mark.parametrize("seed", range(3))
def test_area_law_fit_is_at_least_as_good_as_scipy_least_squares(kind, seed):
    rng = np.random.default_rng(seed)
    n = 8000
    lr = _schedule(kind, n)
    s1, s2 = lr_areas(np.arange(n), lr, n - 1)
    y = 2.0 + 1.5 * s1 ** -(0.3 + 0.1 * seed) - 0.4 * s2 / max(s2.max(), 1e-300)
    y = y * np.exp(0.01 * rng.standard_normal(n))
    y[rng.integers(0, n, 30)] *= 1.5  # spikes the soft-L1 loss should shrug off
    keep = np.unique(np.geomspace(1, n - 1, 60).astype(int))  # log-spaced, as refits bin
    s1, s2, y = s1[keep], s2[keep], y[keep]
    ours = fit_area_law(s1, s2, y)
    f = max(float(1.0484 * np.median(np.abs(np.diff(y)))), 1e-3 * float(np.ptp(y)))
    theirs = _scipy_fit(s1, s2, y, f)
    assert _soft_l1(ours, s1, s2, y, f) <= _soft_l1(theirs, s1, s2, y, f) * (1 + 1e-6)
    if kind == "constant":
        assert ours.C == 0.0
