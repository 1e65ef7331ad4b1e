"""A replica taking a run's live detection over replays the stored run and adopts the stored
episodes: none doubled, none lost (``LiveDetection.take_over``)."""

from __future__ import annotations

import runwatch
from runwatch.pipeline.live import LiveDetection
from runwatch.store import Store


def _log_run(db, name: str, monitor: bool) -> None:
    labels = {"rank": 0, "host": "h"}
    with runwatch.init(name=name, store=db, monitor=monitor, cpu_wait=False, labels=labels) as run:
        for step in range(300):
            run.log({"loss": 12.0 if step in (150, 240) else 3.0 - step / 1000}, step=step)


def _take_over(db, name: str) -> None:
    with Store(db) as store:
        run_id = store.run_id(name)
        points, events = store.read_points(run_id), store.events(run_id)
    detection = LiveDetection(str(db), run_id)
    detection.take_over(points, events)
    assert detection.close()


def _live(db, name: str):
    with Store(db, readonly=True) as store:
        return store.anomalies(name, source="live")


def test_episodes_the_old_owner_stored_keep_their_rows(tmp_path):
    db = tmp_path / "r.db"
    _log_run(db, "r", monitor=True)  # the old owner stored its episodes live
    before = _live(db, "r")
    assert sorted(before["start_step"]) == [150, 240]
    _take_over(db, "r")
    after = _live(db, "r")
    assert sorted(after["id"]) == sorted(before["id"])  # the same rows, none added


def test_episodes_the_old_owner_never_stored_are_stored_once(tmp_path):
    db = tmp_path / "r.db"
    _log_run(db, "r", monitor=False)  # died before storing anything
    assert _live(db, "r").empty
    _take_over(db, "r")
    _take_over(db, "r")  # and the next owner after that one adopts them in turn
    assert sorted(_live(db, "r")["start_step"]) == [150, 240]
