"""Contract tests over every detector class (a habit of online-ml/river)."""

from __future__ import annotations

import copy
import inspect
import math
import pickle

import numpy as np
import pytest

from runwatch.detect import DETECTORS, Detector, Signal
from runwatch.model import SEVERITIES

from .conftest import loss_curve

IMMUTABLE = (int, float, str, bool, type(None), tuple, frozenset)


def feed(det: Detector, steps, values) -> list[str | None]:
    """Signals as reprs (NaN observed values compare equal that way)."""
    out = [det.update(int(s), float(v)) for s, v in zip(steps, values, strict=True)]
    return [None if o is None else repr(o) for o in out]


def signals(det: Detector, steps, values) -> list[Signal | None]:
    return [det.update(int(s), float(v)) for s, v in zip(steps, values, strict=True)]


def curve_with_faults(n: int = 1500) -> np.ndarray:
    v = loss_curve(n, seed=7)
    v[600] *= 3.0
    v[900:960] *= 1.3
    v[1200] = float("nan")
    return v


@pytest.fixture(params=DETECTORS, ids=lambda c: c.__name__)
def cls(request) -> type[Detector]:
    return request.param


def test_every_detector_has_a_docstring_saying_what_it_catches_and_misses(cls):
    doc = inspect.getdoc(cls) or ""
    assert "Catches" in doc and "Misses" in doc and ">>>" in doc
    if cls.__name__ != "NonFinite":
        assert "protect" in doc.lower()


def test_defaults_are_immutable(cls):
    for name, p in inspect.signature(cls.__init__).parameters.items():
        if name != "self":
            assert isinstance(p.default, IMMUTABLE), f"{cls.__name__}.{name} default is mutable"


def test_parameters_are_stored_as_given_and_repr_round_trips(cls):
    det = cls()
    params = det._get_params()
    for name, value in params.items():
        assert getattr(det, name) == value
    assert eval(repr(det), {cls.__name__: cls}, {})._get_params() == params


def test_bad_parameter_is_rejected_naming_valid_values(cls):
    sig = inspect.signature(cls.__init__)
    name, p = next(
        (n, p)
        for n, p in sig.parameters.items()
        if isinstance(p.default, (int, float, str)) and not isinstance(p.default, bool)
    )
    bad = "nonsense" if isinstance(p.default, str) else -1e9
    with pytest.raises(ValueError, match="valid values"):
        cls(**{name: bad})


def test_pickle_keeps_state_and_behaviour(cls):
    v = curve_with_faults()
    s = np.arange(1, v.size + 1)
    det = cls()
    feed(det, s[:800], v[:800])
    twin = pickle.loads(pickle.dumps(det))
    assert feed(twin, s[800:], v[800:]) == feed(det, s[800:], v[800:])


def test_clone_is_fresh_with_same_params_and_deepcopy_is_equal(cls):
    v = curve_with_faults()
    s = np.arange(1, v.size + 1)
    det = cls()
    out = feed(det, s, v)
    fresh = det.clone()
    assert fresh._get_params() == det._get_params()
    assert feed(fresh, s, v) == out
    det2 = cls()
    feed(det2, s[:700], v[:700])
    dup = copy.deepcopy(det2)
    assert feed(dup, s[700:], v[700:]) == feed(det2, s[700:], v[700:])


def test_reset_forgets(cls):
    v = curve_with_faults()
    s = np.arange(1, v.size + 1)
    det = cls()
    first = feed(det, s, v)
    det.reset()
    assert feed(det, s, v) == first


def test_does_not_mutate_its_input_and_returns_the_contract(cls):
    v = curve_with_faults()
    s = np.arange(1, v.size + 1)
    before = v.copy()
    det = cls()
    for sig in signals(det, s, v):
        assert sig is None or (isinstance(sig, Signal) and sig.severity in SEVERITIES)
        if sig is not None:
            assert math.isfinite(sig.score) or sig.score == math.inf
    np.testing.assert_array_equal(v, before)


@pytest.mark.parametrize(
    "values",
    [
        [],
        [3.0],
        [float("nan")] * 50,
        [2.5] * 3000,
        [float("inf"), float("-inf"), 0.0, -1.0, 1e308, 1e-308] * 50,
    ],
    ids=["empty", "one", "all_nan", "constant", "extremes"],
)
def test_bad_input_never_raises(cls, values):
    det = cls()
    out = feed(det, range(len(values)), values)
    if values and all(v == 2.5 for v in values):
        assert all(o is None for o in out), "a constant curve is not an anomaly"


def test_out_of_order_and_huge_gaps_do_not_raise(cls):
    det = cls()
    v = loss_curve(600, seed=3)
    steps = list(range(300)) + [10**7 + i for i in range(150)] + list(range(150, 300))
    feed(det, steps, v)
