"""Hypotheses ranked by evidence: which attribute value best explains an incident's occurrences.

An incident (a crash signature, a recurring spike) has occurrences, each with attributes: the
host, rank and GPU it happened on and the step context the user logged (``shard``,
``data_source``, ``code_version``...). Every ``attribute=value`` is a candidate cause. It is
ranked by how much better "the occurrences concentrate on this value" explains them than "the
occurrences fall by exposure", where the exposure of a value is its share of the chances to
occur: the share of steps under that context, or of ranks on that host.

**The score** is a Bayes factor, chosen over a p-value because it is read the same way for
9 occurrences or 9,000 and has a calibrated threshold that needs no multiple-testing table.
For a value with exposure share ``p`` and ``k`` of the ``n`` occurrences:

- chance: ``k ~ Binomial(n, p)``;
- concentration: ``k ~ Binomial(n, q)`` with ``q`` uniform on ``(p, 1)`` (a Beta(1, 1) prior
  cut to rates above the share: a cause raises the rate, it does not lower it);
- the Bayes factor ``BF = P(k | concentration) / P(k | chance)``, exactly (no approximation:
  the integral is a Beta function times a binomial tail);
- ``score = log10(BF * p)``: the log posterior odds of the value against chance when each value's
  prior weight is its exposure share. An attribute's values together get the same prior weight
  whatever their number, so a rank among 1,024 gets no more chances than a host among 8, and
  scores compare across attributes. A single occurrence scores ``log10((1 + p) / 2) <= 0``
  whatever value it lands on: one point is never a cause.

**The threshold** :data:`CLEAR_SCORE` = 2 (odds of 100 to 1). Under chance ``E[BF] = 1``, so by
Markov's inequality summed over an attribute's values (weights summing to 1) the probability
that *any* value of an attribute reaches score 2 is at most 1%, for any ``n`` (2% for hosts,
whose pairs are a second family of values). Below it the ranking says "no clear cause".

**Spread.** An attribute is *spread* when its occurrences land on at least
``min(SPREAD_VALUES, number of values)`` different values and no value scores above 0 (none is
more likely than chance): "spread over 8 hosts, so not a host". Crashes spread over the hosts
point to software or data; crashes concentrated on one host point to hardware.

**Pairs.** Host values are also scored two at a time (:data:`PAIRED`), as one value whose
share is the two shares summed and whose prior weight is that over ``hosts - 1``; a pair is
kept only where it scores above both hosts alone. A flaky link shows as its two hosts.

Catches: one value (a shard, a host, a rank) that carries more of the occurrences than its
share; two hosts that do together (a link between them). Misses:
causes that are no logged attribute; interactions (shard s17 *on* host n5 only); nested
attributes are scored apart (a failing rank also makes its host score, lower).

>>> occurrences = [{"host": f"n{i % 8}", "shard": "s17"} for i in range(9)]
>>> exposure = {"host": {f"n{i}": 1 for i in range(8)},
...             "shard": {"s17": 4, "other": 96}}
>>> top = rank_hypotheses(occurrences, exposure, noun="crashes")[0]
>>> top.cause, round(top.score, 1), top.k, top.n
('shard=s17', 10.2, 9, 9)
>>> top.evidence
'9 of 9 crashes in steps with shard=s17, which is 4% of steps; spread over 8 hosts, so not a host'
>>> rank_hypotheses([{"host": "n3"}], {"host": {f"n{i}": 1 for i in range(8)}})[0].score < 0
True
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

log = logging.getLogger("runwatch.detect.hypotheses")

CLEAR_SCORE = 2.0
"""A hypothesis at or above this score (log10 posterior odds against chance) is a clear cause."""

SPREAD_VALUES = 3
"""An attribute is spread only if its occurrences touch at least this many of its values."""

HARDWARE = ("host", "rank", "gpu")
"""Attributes that name hardware: spread over them points to software or data."""

_UNITS = {"host": "ranks", "rank": "ranks", "gpu": "GPUs"}

PAIRED = ("host",)
"""Attributes whose values are also scored two at a time: a link between two hosts."""


@dataclass(frozen=True)
class Hypothesis:
    """One candidate cause ``attribute=value`` and its evidence.

    Parameters
    ----------
    cause
        ``"attribute=value"``, e.g. ``"shard=s17"``.
    attribute, value
        The attribute and the value (as the exposure spells it).
    score
        ``log10(BF * share)``: log posterior odds against chance (see the module docstring);
        :data:`CLEAR_SCORE` or more is a clear cause, 0 or less is no evidence.
    k, n
        Occurrences with this value, of the occurrences that have the attribute.
    share
        The value's exposure share (normalised weight).
    evidence
        The same in words, e.g. "9 of 9 crashes in steps with shard=s17, which is 4% of steps".
    spread
        Whether the attribute's occurrences are spread over its values, none of them more
        likely than chance (see the module docstring).
    """

    cause: str
    attribute: str
    value: Any
    score: float
    k: int
    n: int
    share: float
    evidence: str
    spread: bool = False

    @property
    def clear(self) -> bool:
        """Whether the score reaches :data:`CLEAR_SCORE`."""
        return self.score >= CLEAR_SCORE


def rank_hypotheses(
    occurrences: Sequence[Mapping[str, Any]],
    exposure: Mapping[str, Mapping[Any, float]],
    *,
    noun: str = "occurrences",
    units: Mapping[str, str] | None = None,
) -> list[Hypothesis]:
    """Rank every ``attribute=value`` that has occurrences by its score, best first.

    Only the attributes in ``exposure`` are ranked; an occurrence without an attribute (or with
    None) does not count for that attribute, so ``n`` can differ between attributes. Values are
    matched as text (rank ``7`` and ``"7"`` are one value). If some attributes are spread, the
    first hypothesis's evidence ends with a note for each ("spread over 8 hosts, so not a host").

    Parameters
    ----------
    occurrences
        One mapping of attributes per occurrence, e.g. ``{"host": "n3", "rank": 7}``.
    exposure
        Per attribute, each value's weight: steps under a context value, ranks on a host. The
        weights of an attribute are normalised to shares; they must be finite and >= 0, and a
        value with occurrences must have a positive weight.
    noun
        What the occurrences are, plural ("crashes"), for the evidence.
    units
        Per attribute, what its exposure is a share of, plural, for the evidence; default
        "ranks" for host and rank, "GPUs" for gpu, "steps" for anything else.

    Raises
    ------
    ValueError
        No occurrences, an occurrence that is no mapping, bad or all-zero weights, or an
        occurrence value with no (or zero) exposure.
    """
    if isinstance(occurrences, Mapping) or not isinstance(occurrences, Sequence):
        raise ValueError("occurrences must be a list of mappings (one per occurrence)")
    if len(occurrences) == 0:
        raise ValueError("occurrences is empty: there is nothing to explain")
    for i, occ in enumerate(occurrences):
        if not isinstance(occ, Mapping):
            raise ValueError(f"occurrence {i} is a {type(occ).__name__}, not a mapping")
    if not isinstance(exposure, Mapping) or not exposure:
        raise ValueError("exposure must be a non-empty mapping attribute -> {value: weight}")
    units = {**_UNITS, **(units or {})}

    hypotheses: list[Hypothesis] = []
    notes: list[str] = []
    for attribute, weights in exposure.items():
        shares, names = _shares(attribute, weights)
        counts = _counts(attribute, occurrences, shares, names)
        n = sum(counts.values())
        if n == 0:
            log.debug("no occurrence has %r; not ranked", attribute)
            continue
        scores = {key: score(k, n, shares[key]) for key, k in counts.items()}
        spread = (
            len(shares) > 1
            and len(counts) >= min(SPREAD_VALUES, len(shares))
            and max(scores.values()) <= 0.0
        )
        note = _spread_note(attribute, len(counts), len(shares)) if spread else ""
        if note:
            notes.append(note)
        unit = units.get(attribute, "steps")
        if attribute in PAIRED and len(shares) >= 3:
            hypotheses += _pairs(attribute, counts, scores, shares, names, n, noun, unit)
        for key, k in counts.items():
            words = _evidence(attribute, names[key], k, n, shares[key], noun, unit)
            hypotheses.append(
                Hypothesis(
                    cause=f"{attribute}={names[key]}",
                    attribute=attribute,
                    value=names[key],
                    score=scores[key],
                    k=k,
                    n=n,
                    share=shares[key],
                    evidence=f"{words}; {note}" if note else words,
                    spread=spread,
                )
            )
    hypotheses.sort(key=lambda h: (-h.score, -h.k, h.cause))
    if hypotheses and notes and not hypotheses[0].spread:
        top = hypotheses[0]
        evidence = "; ".join([top.evidence, *notes])
        hypotheses[0] = Hypothesis(**{**top.__dict__, "evidence": evidence})
    return hypotheses


def summarize(hypotheses: Sequence[Hypothesis], threshold: float = CLEAR_SCORE) -> str:
    """One line for an incident: the clear cause and its evidence, or "no clear cause".

    >>> summarize([])
    'no clear cause: no attribute to compare'
    """
    if not hypotheses:
        return "no clear cause: no attribute to compare"
    top = hypotheses[0]
    if top.score >= threshold:
        return f"likely {top.cause}: {top.evidence}"
    return f"no clear cause (best {top.cause}, score {top.score:.1f}): {top.evidence}"


def score(k: int, n: int, p: float) -> float:
    """``log10(BF * p)`` for ``k`` of ``n`` occurrences on a value of exposure share ``p``.

    ``BF`` compares ``Binomial(n, q)``, ``q`` uniform on ``(p, 1)``, with ``Binomial(n, p)``:
    ``BF = B(k+1, n-k+1) * P(Binomial(n+1, p) <= k) / ((1-p) * p**k * (1-p)**(n-k))``, since
    the integral of ``q**k (1-q)**(n-k)`` from ``p`` to 1 is that Beta function times the
    upper tail of ``Beta(k+1, n-k+1)`` at ``p``, which is that binomial sum.

    >>> round(score(1, 1, 0.125), 3)  # one occurrence: log10((1 + p) / 2)
    -0.25
    """
    if not (0 <= k <= n) or n < 1:
        raise ValueError(f"need 0 <= k <= n and n >= 1, got k={k}, n={n}")
    if not (0.0 < p <= 1.0):
        raise ValueError(f"share must be in (0, 1], got {p}")
    if p >= 1.0:
        return 0.0  # every chance to occur is under this value: it cannot tell
    log_beta = math.lgamma(k + 1) + math.lgamma(n - k + 1) - math.lgamma(n + 2)
    log_null = k * math.log(p) + (n - k) * math.log1p(-p)
    log_bf = log_beta + _log_binom_cdf(k, n + 1, p) - math.log1p(-p) - log_null
    return (log_bf + math.log(p)) / math.log(10.0)


def _log_binom_cdf(k: int, n: int, p: float) -> float:
    """``log P(Binomial(n, p) <= k)``, summing the pmf in logs (from the pmf's ratios)."""
    j = np.arange(k, dtype=float)
    ratios = np.log((n - j) / (j + 1.0)) + math.log(p) - math.log1p(-p)
    log_pmf = np.concatenate(([0.0], np.cumsum(ratios))) + n * math.log1p(-p)
    top = float(log_pmf.max())
    return min(0.0, top + math.log(float(np.exp(log_pmf - top).sum())))


def _shares(attribute: str, weights: Any) -> tuple[dict[str, float], dict[str, Any]]:
    """Normalised shares keyed by the value's text, and the values as the exposure spells them."""
    if not isinstance(weights, Mapping) or not weights:
        raise ValueError(f"exposure[{attribute!r}] must be a non-empty mapping value -> weight")
    raw: dict[str, float] = {}
    names: dict[str, Any] = {}
    for value, weight in weights.items():
        key = str(value)
        if key in raw:
            raise ValueError(f"exposure[{attribute!r}] has the value {key!r} twice")
        try:
            w = float(weight)
        except (TypeError, ValueError):
            raise ValueError(
                f"exposure[{attribute!r}][{value!r}] is {weight!r}, not a number"
            ) from None
        if not math.isfinite(w) or w < 0:
            raise ValueError(f"exposure[{attribute!r}][{value!r}] is {weight!r}; need finite >= 0")
        raw[key], names[key] = w, value
    total = sum(raw.values())
    if total <= 0:
        raise ValueError(f"exposure[{attribute!r}] has only zero weights")
    return {key: w / total for key, w in raw.items()}, names


def _counts(
    attribute: str,
    occurrences: Sequence[Mapping[str, Any]],
    shares: Mapping[str, float],
    names: Mapping[str, Any],
) -> dict[str, int]:
    counts: dict[str, int] = {}
    for i, occ in enumerate(occurrences):
        value = occ.get(attribute)
        if value is None:
            continue
        key = str(value)
        if key not in shares:
            raise ValueError(
                f"occurrence {i} has {attribute}={value!r}, which has no exposure entry "
                f"(exposure[{attribute!r}] holds {len(shares)} values)"
            )
        if shares[key] <= 0:
            raise ValueError(
                f"occurrence {i} has {attribute}={value!r}, whose exposure weight is 0"
            )
        counts[key] = counts.get(key, 0) + 1
    return counts


def _pairs(
    attribute: str,
    counts: Mapping[str, int],
    scores: Mapping[str, float],
    shares: Mapping[str, float],
    names: Mapping[str, Any],
    n: int,
    noun: str,
    unit: str,
) -> list[Hypothesis]:
    """Two values together as one cause (a flaky link between two hosts), kept where the
    pair explains the occurrences better than either value alone. A pair's prior weight is
    its share over ``values - 1`` (each value is in that many pairs, so an attribute's
    pairs together weigh what its single values weigh) and it is scored as one value."""
    out = []
    keys = sorted(counts)
    others = len(shares) - 1
    for i, a in enumerate(keys):
        for b in keys[i + 1 :]:
            k, p = counts[a] + counts[b], shares[a] + shares[b]
            if p >= 1.0:
                continue
            pair_score = score(k, n, p) - math.log10(others)
            if pair_score <= max(scores[a], scores[b]):
                continue
            value = f"{names[a]}+{names[b]}"
            words = (
                f"{k} of {n} {_singular(noun, n)} on {_plural(attribute)} {names[a]} and "
                f"{names[b]} together, which have {_pct(p)} of {unit}: a link between them?"
            )
            out.append(
                Hypothesis(f"{attribute}={value}", attribute, value, pair_score, k, n, p, words)
            )
    return out


def _pct(p: float) -> str:
    if p < 1e-4:
        return "<0.01%"
    return f"{p * 100:.3g}%"


def _plural(attribute: str) -> str:
    return "GPUs" if attribute == "gpu" else f"{attribute}s"


def _singular(noun: str, k: int) -> str:
    if k != 1:
        return noun
    for end in ("ches", "shes", "sses", "xes"):
        if noun.endswith(end):
            return noun[:-2]
    return noun[:-1] if noun.endswith("s") else noun


def _evidence(attribute: str, value: Any, k: int, n: int, p: float, noun: str, unit: str) -> str:
    head = f"{k} of {n} {_singular(noun, n)}"
    of = "all the" if p >= 1.0 else f"{_pct(p)} of"
    if attribute in HARDWARE:
        verb = "has" if attribute == "host" else "is"
        where = f"on {attribute} {value}, which {verb} {of} {unit}"
    else:
        where = f"in steps with {attribute}={value}, which is {of} {unit}"
    if p >= 1.0:
        return f"{head} {where}, so it cannot tell"
    if k / n <= p:
        return f"{head} {where} (no more than its share)"
    return f"{head} {where}"


def _spread_note(attribute: str, hit: int, values: int) -> str:
    over = (
        f"{values} {_plural(attribute)}"
        if hit == values
        else f"{hit} of {values} {_plural(attribute)}"
    )
    return f"spread over {over}, so not a {attribute}"
