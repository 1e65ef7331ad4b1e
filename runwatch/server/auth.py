"""Bearer-token auth (constant-time compare) and a per-address rate limit.

The token is compared with :func:`hmac.compare_digest` on bytes, so the time a refusal takes
does not tell an attacker how many leading characters were right. It is never logged or echoed:
a refusal says only that the token was missing or wrong.

The rate limit is a token bucket per client address (requests, not points: a request's points
are bounded by the body size limit). Its default is generous because every rank of a job on one
host shares an address; it is there to stop a runaway client loop from starving the others.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Callable

from runwatch.server.errors import ApiError


class TokenCheck:
    """Refuses requests without ``Authorization: Bearer <token>``; ``token=None`` allows all
    (``--insecure``, loopback only, decided by the serve command)."""

    def __init__(self, token: str | None) -> None:
        self._token = None if token is None else token.encode()

    @property
    def enabled(self) -> bool:
        return self._token is not None

    def __call__(self, authorization: str | None) -> None:
        if self._token is None:
            return
        if not authorization:
            raise ApiError(
                401,
                "missing bearer token",
                "Authorization",
                "send 'Authorization: Bearer <token>'",
                {"WWW-Authenticate": "Bearer"},
            )
        scheme, _, given = authorization.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            given.strip().encode(), self._token
        ):
            raise ApiError(
                401,
                "wrong bearer token",
                "Authorization",
                "the token was not accepted",
                {"WWW-Authenticate": 'Bearer error="invalid_token"'},
            )


class RateLimit:
    """Token bucket per key: ``rate`` requests a second, bursts up to ``burst``."""

    def __init__(
        self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._rate = rate
        self._burst = burst
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}

    def __call__(self, key: str) -> None:
        if self._rate <= 0:
            return
        now = self._clock()
        tokens, last = self._buckets.get(key, (self._burst, now))
        tokens = min(self._burst, tokens + (now - last) * self._rate)
        if tokens < 1.0:
            wait = max(1, int((1.0 - tokens) / self._rate + 0.999))
            raise ApiError(
                429,
                "rate limit exceeded",
                None,
                f"more than {self._rate:g} requests/s from {key}",
                {"Retry-After": str(wait)},
            )
        self._buckets[key] = (tokens - 1.0, now)
        if len(self._buckets) > 10_000:  # forget idle clients
            self._buckets = {k: v for k, v in self._buckets.items() if now - v[1] < 60}
