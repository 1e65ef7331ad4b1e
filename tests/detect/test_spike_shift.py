"""A spike that does not end is a level shift: a warning once it lasts, however small."""

from __future__ import annotations

import numpy as np

from runwatch.detect.roles import detectors_for
from runwatch.detect.spike import Spike


def loss_with_rise(rise: float, start: int, length: int, n: int = 400) -> np.ndarray:
    """A slowly falling loss with 1% noise, raised by ``rise`` on ``length`` points from
    ``start``."""
    rng = np.random.default_rng(7)
    steps = np.arange(n)
    loss = 3.0 * (1 + steps / 200) ** -0.1 * np.exp(rng.normal(0, 0.01, n))
    loss[start : start + length] *= 1 + rise
    return loss


def severities(detector: Spike, values: np.ndarray) -> list[tuple[int, str]]:
    return [(s, sig.severity) for s, v in enumerate(values) if (sig := detector.update(s, v))]


def test_a_lasting_rise_of_eight_percent_becomes_a_warning_after_shift_after_points():
    detector = Spike()
    hits = [
        (s, sig)
        for s, v in enumerate(loss_with_rise(0.08, 150, 250))
        if (sig := detector.update(s, v))
    ]
    assert hits and hits[0][0] == 150 and hits[0][1].severity == "info"  # a small spike
    assert hits[0][1].message.startswith("spike:")
    warned = [(s, sig) for s, sig in hits if sig.severity == "warning"]
    assert warned and warned[0][0] == 150 + detector.shift_after - 1  # then it lasted
    assert warned[0][1].message.startswith("level shift:")


def test_a_short_rise_of_the_same_size_stays_info():
    hits = severities(Spike(), loss_with_rise(0.08, 150, 20))
    assert hits and {sev for _, sev in hits} == {"info"}


def test_a_lasting_rise_under_shift_ratio_stays_info():
    hits = severities(Spike(shift_ratio=1.2), loss_with_rise(0.08, 150, 250))
    assert hits and {sev for _, sev in hits} == {"info"}


def test_grad_norms_keep_their_own_lasting_rule():
    # A grad norm rises over training as a matter of course: only a lasting burst of
    # three times its level is a warning, as before.
    spike = next(d for d in detectors_for("grad_norm", "grad_norm") if isinstance(d, Spike))
    assert spike.shift_ratio == spike.sustain_ratio == 3.0
