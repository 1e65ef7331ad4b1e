"""LoggingHandler and the fault-line patterns it uses, against a fake Run."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from runwatch.hook import logging_handler
from runwatch.hook.logging_handler import LoggingHandler
from runwatch.log_patterns import classify_log_message
from runwatch.model import EVENT_KINDS


class FakeRun:
    """Records calls the way the real Run receives them."""

    def __init__(self, fail: bool = False) -> None:
        self.logs: list[tuple[dict[str, Any], int | None]] = []
        self.events: list[dict[str, Any]] = []
        self.fail = fail

    def log(self, data: dict[str, Any], step: int | None = None) -> None:
        if self.fail:
            raise RuntimeError("store is on fire")
        self.logs.append((dict(data), step))

    def event(self, kind: str, step: int | None = None, message: str = "", **attrs: Any) -> None:
        if self.fail:
            raise RuntimeError("store is on fire")
        self.events.append({"kind": kind, "step": step, "message": message, **attrs})


@pytest.fixture
def logger() -> Iterator[logging.Logger]:
    log = logging.getLogger("train.test_logging_handler")
    log.setLevel(logging.DEBUG)
    log.propagate = False
    yield log
    for handler in list(log.handlers):
        log.removeHandler(handler)


def _attach(logger: logging.Logger, run: Any = None, **kwargs: Any) -> LoggingHandler:
    handler = LoggingHandler(run, **kwargs)
    logger.addHandler(handler)
    return handler


def test_metrics_in_extra_become_points(logger):
    run = FakeRun()
    _attach(logger, run)
    logger.info("step done", extra={"step": 100, "metrics": {"loss": 2.31, "lr": 3e-4}})
    logger.debug("no step", extra={"metrics": {"loss": 2.2}})
    assert run.logs == [({"loss": 2.31, "lr": 3e-4}, 100), ({"loss": 2.2}, None)]
    assert run.events == []


def test_info_without_metrics_is_ignored(logger):
    run = FakeRun()
    _attach(logger, run)
    logger.info("epoch 3 starting", extra={"step": 5})
    assert run.logs == [] and run.events == []


def test_warning_becomes_a_log_event_with_level_and_logger(logger):
    run = FakeRun()
    _attach(logger, run)
    logger.warning("loss scale lowered to %d", 1024, extra={"step": 42})
    logger.error("dataloader worker slow")
    assert run.events == [
        {
            "kind": "log",
            "step": 42,
            "message": "loss scale lowered to 1024",
            "level": "WARNING",
            "logger": "train.test_logging_handler",
        },
        {
            "kind": "log",
            "step": None,
            "message": "dataloader worker slow",
            "level": "ERROR",
            "logger": "train.test_logging_handler",
        },
    ]


def test_event_level_is_configurable(logger):
    run = FakeRun()
    _attach(logger, run, event_level=logging.ERROR)
    logger.warning("just a warning")
    logger.critical("giving up")
    assert [(e["kind"], e["level"]) for e in run.events] == [("log", "CRITICAL")]


def test_handler_level_filters_everything(logger):
    run = FakeRun()
    _attach(logger, run, level=logging.ERROR)
    logger.info("m", extra={"metrics": {"loss": 1.0}})
    assert run.logs == []


def test_nccl_timeout_line_becomes_an_nccl_timeout_event(logger):
    run = FakeRun()
    _attach(logger, run)
    logger.error(
        "[PG 0 Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=88, "
        "OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600087 "
        "milliseconds before timing out.",
        extra={"step": 1234},
    )
    (event,) = run.events
    assert event["kind"] == "nccl_timeout"
    assert event["step"] == 1234
    assert (event["rank"], event["op"], event["timeout_ms"]) == (3, "ALLREDUCE", 600000)
    assert event["level"] == "ERROR"


def test_xid_line_becomes_an_xid_event_with_the_code(logger):
    run = FakeRun()
    _attach(logger, run)
    logger.warning("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.")
    (event,) = run.events
    assert event["kind"] == "xid" and event["xid"] == 79 and event["pci"] == "0000:3b:00"


def test_exception_text_is_classified_too(logger):
    run = FakeRun()
    _attach(logger, run)

    class OutOfMemoryError(RuntimeError):
        """Named like torch's, which the classifier recognises by name."""

    try:
        raise OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    except OutOfMemoryError:
        logger.exception("training step failed", extra={"step": 9})
    (event,) = run.events
    assert event["kind"] == "oom"
    assert event["message"] == "training step failed"
    assert event["exception"].startswith("OutOfMemoryError: CUDA out of memory")
    assert event["level"] == "ERROR"


def test_traceback_and_critical_stay_log_events(logger):
    run = FakeRun()
    _attach(logger, run)
    logger.critical("Traceback (most recent call last):\n  File 'train.py', line 3\nKeyError: 'x'")
    assert run.events[0]["kind"] == "log"


def test_a_failing_run_never_raises_into_the_caller(logger, monkeypatch):
    monkeypatch.setattr(logging, "raiseExceptions", False)
    handler = _attach(logger, FakeRun(fail=True))
    logger.error("boom", extra={"metrics": {"loss": 1.0}})
    logger.error("boom again")
    assert handler.dropped["error"] == 2


def test_handle_error_path_reports_to_stderr_not_the_caller(logger, capsys):
    handler = _attach(logger, FakeRun(fail=True))
    logger.error("boom")  # logging.raiseExceptions is True under pytest: printed, not raised
    assert "store is on fire" in capsys.readouterr().err
    assert handler.dropped["error"] == 1


def test_bad_metrics_are_counted_not_raised(logger):
    run = FakeRun()
    handler = _attach(logger, run)
    logger.info("x", extra={"metrics": [1, 2, 3], "step": 1})
    assert run.logs == [] and handler.dropped["bad_metrics"] == 1


def test_runwatch_own_records_are_ignored():
    run = FakeRun()
    handler = LoggingHandler(run)
    own = logging.getLogger("runwatch.hook.writer")
    own.addHandler(handler)
    try:
        own.error("NCCL timeout while flushing", extra={"metrics": {"loss": 1.0}})
        logging.getLogger("runwatch").error("top-level")
    finally:
        own.removeHandler(handler)
    assert run.logs == [] and run.events == []
    # a logger that merely starts with the same letters is not ours
    other = logging.getLogger("runwatchers")
    other.addHandler(handler)
    try:
        other.error("not ours")
    finally:
        other.removeHandler(handler)
    assert len(run.events) == 1


def test_a_run_that_logs_while_called_does_not_recurse(logger):
    handler = _attach(logger, None)

    class ChattyRun(FakeRun):
        def event(self, kind: str, step: int | None = None, message: str = "", **attrs: Any):
            logger.error("nested from inside the run")
            super().event(kind, step, message, **attrs)

    handler.run = ChattyRun()
    logger.error("outer")
    assert [e["message"] for e in handler.run.events] == ["outer"]


def test_without_a_run_it_uses_the_current_run(logger, monkeypatch):
    run = FakeRun()
    monkeypatch.setattr(logging_handler, "_current_run", lambda: run)
    _attach(logger)
    logger.warning("uses the active run", extra={"step": 3})
    assert run.events[0]["step"] == 3


def test_without_any_active_run_records_are_dropped_and_counted(logger, monkeypatch):
    monkeypatch.setattr(logging_handler, "_current_run", lambda: None)
    handler = _attach(logger)
    logger.warning("nobody listening")
    logger.info("m", extra={"metrics": {"loss": 1.0}})
    logger.info("ignored anyway")
    assert handler.dropped["no_run"] == 2


def test_the_real_current_run_lookup_never_raises(logger):
    # Before runwatch.init (or before the Run module exists) there is no run: nothing breaks.
    handler = _attach(logger)
    logger.warning("early warning")
    assert handler.dropped["error"] == 0


# --------------------------------------------------------------------- classify_log_message

NCCL_LINES = [
    "[rank3]:[E1121 02:14:07.123456 ProcessGroupNCCL.cpp:616] [Rank 3] Watchdog caught "
    "collective operation timeout: WorkNCCL(SeqNum=123456, OpType=ALLGATHER, NumelIn=262144, "
    "NumelOut=2097152, Timeout(ms)=1800000) ran for 1800092 milliseconds before timing out.",
    "[E ProcessGroupNCCL.cpp:475] [Rank 7] NCCL watchdog thread terminated with exception: "
    "[Rank 7] Watchdog caught collective operation timeout",
    "RuntimeError: NCCL timeout in call to allreduce",
    "ProcessGroupNCCL's watchdog got stuck for 480 seconds without making progress in "
    "monitoring enqueued collectives.",
]

OOM_LINES = [
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total "
    "capacity of 79.10 GiB of which 4.06 MiB is free.",
    "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 3; 39.59 GiB total "
    "capacity; 36.12 GiB already allocated; 1.19 GiB free)",
    "torch.cuda.OutOfMemoryError: CUDA out of memory.",
    "RuntimeError: CUDA error: out of memory",
]

XID_LINES = [
    ("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.", 79, "0000:3b:00"),
    (
        "kernel: [123456.789] NVRM: Xid (PCI:0000:b1:00): 48, pid='<unknown>', name=<unknown>, "
        "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer.",
        48,
        "0000:b1:00",
    ),
    ("NVRM: Xid (0000:07:00): 13, Graphics Exception: ESR 0x404600=0x80000002", 13, "0000:07:00"),
    ("dcgm: XID error 94 on GPU 2", 94, None),
]


@pytest.mark.parametrize("line", NCCL_LINES)
def test_classify_nccl_timeouts(line):
    kind, _ = classify_log_message(line)
    assert kind == "nccl_timeout"


def test_classify_nccl_attrs():
    _, attrs = classify_log_message(NCCL_LINES[0])
    assert attrs == {"rank": 3, "op": "ALLGATHER", "timeout_ms": 1800000}


@pytest.mark.parametrize("line", OOM_LINES)
def test_classify_cuda_oom(line):
    kind, attrs = classify_log_message(line)
    assert kind == "oom" and attrs["device"] == "gpu"


def test_classify_oom_names_the_gpu():
    assert classify_log_message(OOM_LINES[1])[1] == {"device": "gpu", "gpu": 3, "tried": "2.00 GiB"}


def test_classify_host_oom_killer():
    kind, attrs = classify_log_message(
        "Out of memory: Killed process 48213 (python) total-vm:912345kB, anon-rss:812345kB"
    )
    assert (kind, attrs) == ("oom", {"device": "host", "pid": 48213})


@pytest.mark.parametrize(("line", "code", "pci"), XID_LINES)
def test_classify_xid(line, code, pci):
    kind, attrs = classify_log_message(line)
    assert kind == "xid" and attrs["xid"] == code
    assert attrs.get("pci") == pci


@pytest.mark.parametrize(
    "line",
    [
        "",
        "Traceback (most recent call last):",
        "loss is 2.31 at step 100",
        "NCCL INFO Channel 00/32 : 0 1 2 3 4 5 6 7",
        "xidian university dataset loaded",
        "memory usage 71.2 GiB out of 80 GiB",
    ],
)
def test_classify_ordinary_lines_as_log(line):
    assert classify_log_message(line) == ("log", {})


def test_every_kind_is_an_event_kind():
    lines = [*NCCL_LINES, *OOM_LINES, *(x[0] for x in XID_LINES), "plain"]
    assert {classify_log_message(line)[0] for line in lines} <= set(EVENT_KINDS)
