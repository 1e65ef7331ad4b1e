"""Alerting: rules, grouping, silences, a durable outbox, webhooks, and Prometheus export.

Anomaly episodes and failure events (from live detection) become alerts labelled with their
incident; rules route them to channels; groups with Alertmanager's timing turn a storm into
one message per group (by default, one per incident); silences and inhibition
mute what should not page; the outbox in the store makes delivery at-least-once, across
crashes. See ``alerts/runwatch-rules.yaml`` for the rules format and ``payloads.py`` for the
versioned webhook schema.

In a training process this is all wired by ``runwatch.init(webhook=..., alerts=...,
alert_timeout=10.0, prometheus_port=...)``. For ``runwatch serve`` and ``runwatch watch``::

    from runwatch.alerting.setup import resolve_rules, start_engine
    from runwatch.alerting.exporter import start_exporter

    rules = resolve_rules(args.alerts)           # --alerts PATH, else $RUNWATCH_ALERTS /
                                                 # $RUNWATCH_WEBHOOK_URL; None: no alerting
    engine = start_engine(rules, db) if rules else None
    # for each run's LiveDetection / Monitor output (row ids as stored by save_anomalies):
    #     engine.observe(run_name, project, [(row_id, anomaly), ...])
    #     or LiveDetection(..., on_change=engine.bind(run_name, project))
    exporter = start_exporter(db, port=9811, addr="127.0.0.1")   # /metrics; exporter.port
    ...
    engine.close(timeout=10.0)                   # flush groups, wait for the outbox, stop
    exporter.close()

Rules files are checked by :func:`runwatch.alerting.rules.load_rules`, which raises
:class:`RulesError` (a ``ValueError``) naming the file, line and valid values. Receivers can
check signatures with :func:`runwatch.alerting.channels.verify_signature`.

Modules: ``rules`` (loading, validation), ``alert`` (an episode or failure event as an
alert), ``grouping`` (group_wait / group_interval / repeat_interval, a group per incident),
``incidents`` (the store's incidents: labels, benign folds, failure events), ``engine``
(silences, inhibition, outbox writes), ``payloads`` (webhook v1, Slack, Alertmanager),
``channels`` (HTTP, signing, redaction), ``sender`` (retries, backoff, rate limits),
``exporter`` (/metrics), ``setup`` (wiring), ``cli`` (``runwatch silence``, ``runwatch
alerts test``). Nothing heavy is imported by this package itself, so ``runwatch.init``
stays light when alerting is off.
"""

from typing import Any

__all__ = ["RulesError"]


def __getattr__(name: str) -> Any:
    if name == "RulesError":  # lazily, so importing the package imports no YAML parser
        from runwatch.alerting.yamlnodes import RulesError

        return RulesError
    raise AttributeError(f"module 'runwatch.alerting' has no attribute {name!r}")
