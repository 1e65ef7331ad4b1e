"""LoggingHandler against a real run and store: log lines become points and events."""

from __future__ import annotations

import logging

import runwatch


def test_log_records_become_points_and_fault_lines_become_events(db_path):
    logger = logging.getLogger("train.integration")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    with runwatch.init(name="r", store=db_path, monitor=False):
        handler = runwatch.LoggingHandler()
        logger.addHandler(handler)
        try:
            logger.info("step done", extra={"step": 10, "metrics": {"loss": 2.5, "lr": 1e-4}})
            logger.info("step done", extra={"step": 11, "metrics": {"loss": 2.4}})
            logger.warning(
                "[Rank 2] Watchdog caught collective operation timeout: "
                "WorkNCCL(SeqNum=42, OpType=ALLREDUCE) ran for 600000 milliseconds"
            )
            logger.error("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.")
            logger.info("just chatter")
        finally:
            logger.removeHandler(handler)
    with runwatch.open_store(str(db_path)) as store:
        loss = store.read_series("r", "loss")
        events = store.events("r", kinds=["nccl_timeout", "xid", "log"])
    assert loss["step"].tolist() == [10, 11] and loss["value"].tolist() == [2.5, 2.4]
    kinds = events["kind"].tolist()
    assert kinds == ["nccl_timeout", "xid"]
    assert events.iloc[0]["rank"] == 2
    assert '"xid": 79' in events.iloc[1]["attrs"]
