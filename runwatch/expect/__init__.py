"""The expected loss curve: power law, LR-schedule-aware law, reference run, forecast."""

from runwatch.expect.binning import LogBins, bin_arrays
from runwatch.expect.forecast import Forecast, forecast
from runwatch.expect.lrclock import LRClock
from runwatch.expect.lrlaw import AreaLaw, LRLaw, fit_area_law, fit_lr_law, lr_areas
from runwatch.expect.powerlaw import PowerLaw, TooLittleData, fit_power_law
from runwatch.expect.reference import ReferenceCurve

__all__ = [
    "AreaLaw",
    "Forecast",
    "LRClock",
    "LRLaw",
    "LogBins",
    "PowerLaw",
    "ReferenceCurve",
    "TooLittleData",
    "bin_arrays",
    "fit_area_law",
    "fit_lr_law",
    "fit_power_law",
    "forecast",
    "lr_areas",
]
