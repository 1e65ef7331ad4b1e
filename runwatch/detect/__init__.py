"""Detection: the Detector contract, the default detectors, the Monitor and replay."""

from runwatch.detect.base import Detector, Signal
from runwatch.detect.deviation import CurveDeviation
from runwatch.detect.divergence import Divergence
from runwatch.detect.lr import LRSanity
from runwatch.detect.monitor import Monitor
from runwatch.detect.nonfinite import NonFinite
from runwatch.detect.regression import Regression
from runwatch.detect.replay import analyze_frame
from runwatch.detect.roles import DEFAULT_DETECTORS, ROLES, role_of
from runwatch.detect.spike import Spike
from runwatch.detect.spikescore import SpikeScore
from runwatch.detect.stall import Stall

DETECTORS: tuple[type[Detector], ...] = (
    NonFinite,
    Spike,
    Divergence,
    CurveDeviation,
    Regression,
    LRSanity,
    Stall,
)
"""Every detector class (the contract tests run over these)."""

__all__ = [
    "DEFAULT_DETECTORS",
    "DETECTORS",
    "ROLES",
    "CurveDeviation",
    "Detector",
    "Divergence",
    "LRSanity",
    "Monitor",
    "NonFinite",
    "Regression",
    "Signal",
    "Spike",
    "SpikeScore",
    "Stall",
    "analyze_frame",
    "role_of",
]
