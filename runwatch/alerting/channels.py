"""Sending one message through one channel: headers, signature, and what the receiver said.

Headers on every message:

- ``Idempotency-Key``: the outbox row's key, equal on every retry, so a receiver drops
  duplicates (delivery is at-least-once: a receiver that stored a message but answered too
  late is sent it again).
- ``X-Runwatch-Timestamp`` and ``X-Runwatch-Signature: v1=<hex>`` when the channel has a
  secret: HMAC-SHA256 over ``f"{timestamp}.".encode() + body``. Check it with
  :func:`verify_signature` (and reject old timestamps, which stops replays).
- ``X-Runwatch-Schema: runwatch.alert/v1`` on the generic webhook.

URLs and secrets never reach a log line or an error: errors are built from the exception
type and a redacted message, and a filter on the ``httpx``/``httpcore`` loggers (which log
request URLs at INFO/DEBUG) scrubs every configured URL and secret.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import threading
import time
from dataclasses import dataclass

import httpx

from runwatch.alerting.payloads import SCHEMA
from runwatch.alerting.rules import Channel

KEY_HEADER = "Idempotency-Key"
TIMESTAMP_HEADER = "X-Runwatch-Timestamp"
SIGNATURE_HEADER = "X-Runwatch-Signature"
SCHEMA_HEADER = "X-Runwatch-Schema"
RETRY_STATUSES = frozenset({408, 425, 429})
"""4xx answers worth retrying; any other 4xx means the message itself is refused."""


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """The signature header value: ``v1=`` + hex HMAC-SHA256 of ``"{timestamp}." + body``.

    >>> sign("s3cret", 1700000000, b'{}')[:11]
    'v1=97926816'
    """
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return "v1=" + mac.hexdigest()


def verify_signature(
    secret: str,
    timestamp: str | None,
    body: bytes,
    signature: str | None,
    *,
    tolerance: float = 300.0,
    now: float | None = None,
) -> bool:
    """For receivers: True if ``signature`` is valid for ``body`` and the timestamp is fresh."""
    if not timestamp or not signature:
        return False
    try:
        ts = int(timestamp)
    except ValueError:
        return False
    now = time.time() if now is None else now
    if abs(now - ts) > tolerance:
        return False
    return hmac.compare_digest(sign(secret, ts, body), signature)


class _Redactor(logging.Filter):
    """Replaces every registered secret (URLs, signing keys) in log records and texts."""

    def __init__(self) -> None:
        super().__init__()
        self._secrets: set[str] = set()
        self._lock = threading.Lock()

    def add(self, *secrets: str | None) -> None:
        with self._lock:
            self._secrets.update(s for s in secrets if s)

    def __call__(self, text: str) -> str:
        with self._lock:
            secrets = sorted(self._secrets, key=len, reverse=True)
        for secret in secrets:
            text = text.replace(secret, "<redacted>")
        return text

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:
            return True
        clean = self(message)
        if clean != message:
            record.msg, record.args = clean, ()
        return True


redact = _Redactor()
for _name in ("httpx", "httpcore"):
    logging.getLogger(_name).addFilter(redact)


def register_secrets(channel: Channel) -> None:
    """Make sure ``channel``'s URL and secret are scrubbed from logs and errors."""
    redact.add(channel.url, channel.secret)
    try:
        url = httpx.URL(channel.url)
        redact.add(url.path if len(url.path) > 8 else None, url.query.decode() or None)
    except Exception:
        pass


def target_url(channel: Channel) -> str:
    """Where the POST goes: Alertmanager channels name the server; we add the API path."""
    if channel.type == "alertmanager" and not channel.url.rstrip("/").endswith("/api/v2/alerts"):
        return channel.url.rstrip("/") + "/api/v2/alerts"
    return channel.url


@dataclass(frozen=True, slots=True)
class Delivery:
    """What came of one POST: ``retry`` says whether trying again could help."""

    ok: bool
    detail: str
    retry: bool
    status: int | None = None
    retry_after: float | None = None


def deliver(
    client: httpx.Client, channel: Channel, key: str, body: bytes, now: float | None = None
) -> Delivery:
    """POST ``body`` to ``channel``; never raises for a network or HTTP failure."""
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "runwatch-alerts/1",
        KEY_HEADER: key,
        **channel.headers,
    }
    if channel.type == "webhook":
        headers[SCHEMA_HEADER] = SCHEMA
    if channel.secret:
        ts = int(time.time() if now is None else now)
        headers[TIMESTAMP_HEADER] = str(ts)
        headers[SIGNATURE_HEADER] = sign(channel.secret, ts, body)
    try:
        response = client.post(
            target_url(channel), content=body, headers=headers, timeout=channel.timeout
        )
    except httpx.TimeoutException as exc:
        return Delivery(False, f"timeout after {channel.timeout:g} s ({type(exc).__name__})", True)
    except httpx.HTTPError as exc:
        return Delivery(False, f"{type(exc).__name__}: {redact(str(exc))}"[:300], True)
    text = redact(response.text.strip().replace("\n", " ")[:200])
    status = response.status_code
    detail = f"HTTP {status}" + (f": {text}" if text else "")
    if 200 <= status < 300:
        return Delivery(True, detail, False, status)
    retry_after = None
    if status in (429, 503):
        try:
            retry_after = float(response.headers.get("Retry-After", ""))
        except ValueError:
            retry_after = None
    return Delivery(False, detail, status >= 500 or status in RETRY_STATUSES, status, retry_after)
