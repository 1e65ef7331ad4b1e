"""The outbox worker: claims due messages from the store, sends them, records every attempt.

Delivery is at-least-once. A message stays ``pending`` until a receiver answers 2xx; a
failure worth retrying (refused connection, timeout, 5xx, 408/425/429) is tried again after
an exponential backoff with jitter (half the delay fixed, half random, so a thousand
messages do not retry in lockstep), until the message is older than ``max_age``; a refusal
(any other 4xx) fails it at once. Every attempt is a row in ``alert_attempts``.

Why a channel-level backoff as well: when a receiver is down, trying each of 10,000 queued
messages in turn would hammer it and fill the attempts table. After a failure the channel
is *blocked* for a backoff and then probed with a few messages; the rest are not attempted
(and not charged an attempt) until a probe succeeds, and then they go out in batches, a few
requests in flight at once. Per-channel rate limits (a token bucket) hold messages back,
never drop them.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx

from runwatch.alerting.channels import Delivery, deliver, register_secrets
from runwatch.alerting.rules import Channel, Rules
from runwatch.store import Store
from runwatch.store.outbox import AttemptResult, OutboxRow
from runwatch.worker import Worker

log = logging.getLogger("runwatch.alerting")

ROUNDS_PER_CLAIM = 4
"""A claim takes ``concurrency * 4`` messages and leases them for ``4 * timeout`` plus a
margin: enough work per store transaction to drain 10,000 messages quickly, and a lease
that still covers the whole claim if every request times out -- yet short enough that a
killed sender's messages go out again within a minute (defaults: 16 messages, 45 s)."""


def backoff(attempt: int, initial: float, maximum: float, rng: random.Random) -> float:
    """Delay before try ``attempt + 1``: ``min(max, initial * 2**(attempt-1))``, half jittered.

    >>> rng = random.Random(0)
    >>> [round(backoff(n, 1.0, 60.0, rng), 2) for n in (1, 2, 3, 10)]
    [0.92, 1.76, 2.84, 37.77]
    """
    delay = min(maximum, initial * 2 ** max(attempt - 1, 0))
    return delay / 2 + rng.uniform(0, delay / 2)


class _Bucket:
    """A token bucket: ``count`` tokens refilled over ``per`` seconds."""

    def __init__(self, count: int, per: float, now: float) -> None:
        self.count, self.per = count, per
        self.tokens = float(count)
        self.stamp = now

    def available(self, now: float) -> int:
        self.tokens = min(self.count, self.tokens + (now - self.stamp) * self.count / self.per)
        self.stamp = now
        return int(self.tokens)

    def take(self, n: int) -> None:
        self.tokens -= n

    def ready_at(self, now: float) -> float:
        return now + max(0.0, 1 - self.tokens) * self.per / self.count


class _ChannelState:
    def __init__(self, channel: Channel, now: float) -> None:
        self.channel = channel
        self.failures = 0
        self.blocked_until = 0.0
        self.pool = ThreadPoolExecutor(
            max_workers=channel.concurrency, thread_name_prefix=f"runwatch-send-{channel.name}"
        )
        self.bucket = (
            _Bucket(channel.rate_limit.count, channel.rate_limit.per, now)
            if channel.rate_limit
            else None
        )


class Sender:
    """Sends the outbox of ``store_path`` through the channels of ``rules``.

    ``run_once`` does one round synchronously (tests drive it with a fake clock); ``start``
    runs rounds on a thread of its own until ``close``.
    """

    def __init__(
        self,
        store_path: str,
        rules: Rules,
        *,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        client: httpx.Client | None = None,
        lease_margin: float = 5.0,
    ) -> None:
        self._store_path = store_path
        self._rules = rules
        self._clock = clock
        self._rng = rng or random.Random()
        self._lease_margin = lease_margin
        now = clock()
        self._states = {name: _ChannelState(c, now) for name, c in rules.channels.items()}
        for channel in rules.channels.values():
            register_secrets(channel)
        workers = max((c.concurrency for c in rules.channels.values()), default=1)
        self._client = client or httpx.Client(
            limits=httpx.Limits(max_connections=workers * max(len(rules.channels), 1))
        )
        self._store: Store | None = None
        # Rounds back to back while there is work, else a nap until something is due (at
        # most 1 s) or wake() is called.
        self._worker = Worker(
            "runwatch-alert-sender", tick=self._send_due, interval=1.0, first_tick=0.0, logger=log
        )
        self.sent = 0
        self.failed = 0

    @property
    def store(self) -> Store:
        if self._store is None:
            self._store = Store(self._store_path)
        return self._store

    # -- one round ---------------------------------------------------------------------------
    def run_once(self) -> int:
        """Send what is due on every channel; return how many attempts were made."""
        total = 0
        for state in self._states.values():
            total += self._round(state)
        return total

    def _round(self, state: _ChannelState) -> int:
        now = self._clock()
        if state.blocked_until > now:
            return 0
        channel = state.channel
        # After a failure, probe with one request per worker instead of a whole claim.
        rounds = 1 if state.failures else ROUNDS_PER_CLAIM
        limit = channel.concurrency * rounds
        if state.bucket is not None:
            limit = min(limit, state.bucket.available(now))
            if limit <= 0:
                return 0
        lease = channel.timeout * rounds + self._lease_margin
        rows = self.store.claim_alerts(channel.name, limit, lease, now)
        if not rows:
            return 0
        if state.bucket is not None:
            state.bucket.take(len(rows))
        outcomes = list(state.pool.map(lambda r: self._deliver(channel, r), rows))
        now = self._clock()
        results = []
        trouble = False
        for row, outcome in zip(rows, outcomes, strict=True):
            results.append(self._result(row, outcome, now))
            trouble |= not outcome.ok and outcome.retry
        self.store.record_attempts(results, now)
        sent = sum(r.status == "sent" for r in results)
        failed = sum(r.status == "failed" for r in results)
        self.sent += sent
        self.failed += failed
        if trouble:
            state.failures += 1
            hint = max((o.retry_after or 0.0 for o in outcomes), default=0.0)
            delay = max(hint, backoff(state.failures, *self._backoff_range(), self._rng))
            state.blocked_until = now + delay
            log.warning(
                "runwatch: alert channel %r: %d of %d messages not delivered (%s); "
                "retrying in %.1f s",
                channel.name,
                len(rows) - sent,
                len(rows),
                next(o.detail for o in outcomes if not o.ok),
                delay,
            )
        else:
            if state.failures:
                log.info("runwatch: alert channel %r is delivering again", channel.name)
            state.failures = 0
        return len(rows)

    def _backoff_range(self) -> tuple[float, float]:
        d = self._rules.delivery
        return d.initial_backoff, d.max_backoff

    def _deliver(self, channel: Channel, row: OutboxRow) -> Delivery:
        try:
            return deliver(self._client, channel, row.key, row.payload.encode(), self._clock())
        except Exception as exc:  # a runwatch bug must not stop delivery of the rest
            log.exception("runwatch: sending through channel %r failed", channel.name)
            return Delivery(False, f"internal error: {type(exc).__name__}", True)

    def _result(self, row: OutboxRow, outcome: Delivery, now: float) -> AttemptResult:
        if outcome.ok:
            return AttemptResult(row.id, True, outcome.detail, "sent", now)
        attempts = row.attempts + 1
        too_old = now - row.created >= self._rules.delivery.max_age
        if not outcome.retry or too_old:
            why = "refused" if not outcome.retry else "max_age reached"
            log.error(
                "runwatch: alert %s through channel %r failed after %d attempts (%s): %s",
                row.key,
                row.channel,
                attempts,
                why,
                outcome.detail,
            )
            return AttemptResult(row.id, False, f"{outcome.detail} ({why})", "failed", now)
        delay = backoff(attempts, *self._backoff_range(), self._rng)
        if outcome.retry_after:
            delay = max(delay, outcome.retry_after)
        return AttemptResult(row.id, False, outcome.detail, "pending", now + delay)

    # -- the thread --------------------------------------------------------------------------
    def next_wake(self) -> float:
        """When a round could next do something (blocked channels, due rows, rate limits)."""
        now = self._clock()
        wake = now + 1.0
        for state in self._states.values():
            due = self.store.next_alert_due(state.channel.name)
            if due is None:
                continue
            due = max(due, state.blocked_until)
            if state.bucket is not None and state.bucket.available(now) < 1:
                due = max(due, state.bucket.ready_at(now))
            wake = min(wake, due)
        return wake

    def start(self) -> None:
        """Send rounds on a thread of its own until :meth:`close`."""
        self._worker.start()

    @property
    def running(self) -> bool:
        return self._worker.alive

    def wake(self) -> None:
        """Something was queued: a round soon."""
        self._worker.wake()

    def _send_due(self) -> float:
        """The worker's tick: one round; seconds until the next one."""
        if self.run_once():
            return 0.0
        return min(max(self.next_wake() - self._clock(), 0.005), 1.0)

    def pending(self) -> int:
        return self.store.pending_alerts(list(self._states))

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread (after its current round, waiting up to ``timeout`` s)."""
        if self._worker.close(timeout):
            for state in self._states.values():
                state.pool.shutdown(wait=False)
            self._client.close()
            if self._store is not None:
                self._store.close()
                self._store = None
