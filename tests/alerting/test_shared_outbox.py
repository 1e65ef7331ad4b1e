"""Three senders on one PostgreSQL outbox (issue 20: several servers, one truth): alerts
queued while the receiver is down are each delivered once, by idempotency key, once it is
back. A claim is a lease taken in a write transaction, and every write transaction holds the
store's one advisory lock, so no two senders claim one row."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from runwatch.alerting.sender import Sender
from runwatch.store import open_store

from .test_delivery import enqueue, rules_for

ALERTS = 10_000
SENDERS = 3


def test_alerts_queued_while_the_receiver_is_down_go_out_once_from_three_senders(
    receiver: Any, pg_url: str
) -> None:
    url = pg_url
    senders: list[Sender] = []
    try:
        with open_store(url) as store:
            store.start_run("gpt", project="lm")
        receiver.stop()
        keys = enqueue(url, ALERTS)
        rules = rules_for(receiver.url, timeout="5s")
        senders = [Sender(url, rules) for _ in range(SENDERS)]
        for sender in senders:
            sender.start()
        time.sleep(0.5)  # they try, are refused and back off
        receiver.start()
        deadline = time.monotonic() + 240
        with open_store(url, readonly=True) as store:
            while store.pending_alerts() and time.monotonic() < deadline:
                for sender in senders:
                    sender.wake()
                time.sleep(0.2)
            outbox = store.outbox()
    finally:
        for sender in senders:
            sender.close(10)
    assert len(outbox) == ALERTS and set(outbox["status"]) == {"sent"}
    arrived = Counter(receiver.keys())
    assert set(arrived) == set(keys)
    assert max(arrived.values()) == 1  # none twice: no answer was lost on the way back
    assert all(s.sent > 0 for s in senders)  # all three took part
