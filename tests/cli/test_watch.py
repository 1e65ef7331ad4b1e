"""``runwatch watch`` as a subprocess on a logdir a real SummaryWriter is writing."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

torch_tb = pytest.importorskip("torch.utils.tensorboard")

from runwatch.cli_watch import state_path  # noqa: E402
from runwatch.store import Store  # noqa: E402

WAIT_S = 30.0  # a bound for a stuck watcher on a loaded machine, not a latency assert


def wait_for(what: str, check: Callable[[], Any]) -> Any:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        try:
            found = check()
        except Exception:  # the store or the run not made yet
            found = None
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"the watcher did not get {what} in {WAIT_S:.0f} s")


def watcher_log(db: Path) -> Path:
    return db.parent / "watcher.log"


def spawn(cmd: list[str], db: Path) -> subprocess.Popen[str]:
    """Start ``cmd`` (a ``runwatch.cli`` command) writing its output to ``watcher_log``: a
    pipe nobody reads while it runs could fill and block it. ``-X faulthandler`` lets
    ``stop`` have a hung watcher dump its threads' stacks there."""
    with watcher_log(db).open("a") as log:
        return subprocess.Popen(
            [sys.executable, "-X", "faulthandler", "-m", "runwatch.cli", *cmd],
            stdout=log,
            stderr=log,
            text=True,
        )


def start_watcher(root: Path, db: Path, *more: str) -> subprocess.Popen[str]:
    return spawn(["watch", str(root), "--db", str(db), "--poll", "0.1", *more], db)


def stop(watcher: subprocess.Popen[str], db: Path) -> None:
    """SIGTERM the watcher: it must finish and exit 0 within ``WAIT_S``. One that does not
    gets SIGABRT, which dumps its threads' stacks into its log, and the failure shows it."""
    watcher.send_signal(signal.SIGTERM)
    try:
        code = watcher.wait(timeout=WAIT_S)
    except subprocess.TimeoutExpired:
        watcher.send_signal(signal.SIGABRT)
        watcher.wait()
        code = None
    assert code == 0, f"the watcher's exit code: {code}; its log:\n{watcher_log(db).read_text()}"


def live_steps(db: Path, run: str, metric: str = "loss") -> list[int]:
    with Store(db) as store:
        points = store.read_points(run, [metric])
    return points["step"].tolist()


def stored_rows(db: Path, run: str) -> int:
    with Store(db) as store:
        return len(store.read_points(run, all_attempts=True))


def write(writer: Any, steps: range, nan_at: int | None = None) -> None:
    for step in steps:
        writer.add_scalar("loss", math.nan if step == nan_at else 3.0 / (step + 1), step)
    writer.flush()


def test_watch_follows_runs_flags_a_nan_and_survives_kill_9(tmp_path: Path) -> None:
    root, db = tmp_path / "logs", tmp_path / "watch.db"
    writer = torch_tb.SummaryWriter(str(root / "a"), flush_secs=3600)
    watcher = start_watcher(root, db)
    try:
        write(writer, range(30))
        wait_for("run a's 30 steps", lambda: live_steps(db, "a") == list(range(30)))

        other = torch_tb.SummaryWriter(str(root / "new" / "b"))  # a run dir made mid-watch
        write(other, range(5))
        other.close()
        wait_for("the new run", lambda: live_steps(db, "new/b") == list(range(5)))

        write(writer, range(30, 31), nan_at=30)

        def nonfinite() -> bool:
            with Store(db) as store:
                found = store.anomalies("a")
            return bool(
                (found["detector"].str.contains("nonfinite") & (found["start_step"] == 30)).any()
            )

        wait_for("a nonfinite anomaly at step 30", nonfinite)

        def saved_to_the_end() -> bool:
            # The writer may store a point before the watcher saves its position; a kill in
            # between reads it again on restart (stored twice, read once). Kill after the
            # save, so the count below is exact.
            path = state_path(str(db), str(root))
            if not path.exists():
                return False
            files = json.loads(path.read_text())["source"]["files"]
            ends = {key: (root / key).stat().st_size for key in files if key.startswith("a/")}
            return bool(ends) and all(files[k]["offset"] == size for k, size in ends.items())

        wait_for("the saved position at the end of run a's event file", saved_to_the_end)

        watcher.kill()  # SIGKILL: no finish, no last save
        watcher.wait()
        write(writer, range(31, 41))
        watcher = start_watcher(root, db)
        wait_for("steps 31..40 after the restart", lambda: live_steps(db, "a") == list(range(41)))
        stop(watcher, db)
    finally:
        writer.close()
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait()
    assert stored_rows(db, "a") == 41  # every step once: nothing lost, nothing doubled
    assert stored_rows(db, "new/b") == 5
    with Store(db) as store:
        runs = store.runs().set_index("name")
        attempts = store.attempts("a")
    assert runs.loc["a", "status"] == "finished"
    # The restart resumed the run as runwatch.init does: an attempt that supersedes nothing.
    assert attempts["reason"].tolist() == ["start", "resume"]
    saved = json.loads(state_path(str(db), str(root)).read_text())
    assert any(key.startswith("a/") for key in saved["source"]["files"])


def test_watch_of_a_missing_logdir_exits_2(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "runwatch.cli",
            "watch",
            str(tmp_path / "nope"),
            "--db",
            str(tmp_path / "x.db"),
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
    assert "nope: no such directory" in out.stderr


def nanogpt_lines(steps: range, nan_at: int | None = None) -> str:
    return "".join(
        f"iter {i}: loss {'nan' if i == nan_at else f'{3.0 / (i + 1):.4f}'}, time 100.00ms, "
        "mfu 10.00%\n"
        for i in steps
    )


def test_watch_log_follows_a_job_log_and_resumes_after_kill_9(tmp_path: Path) -> None:
    pytest.importorskip("runwatch.collectors.joblog")
    log, db = tmp_path / "train.log", tmp_path / "watch.db"
    log.write_text(nanogpt_lines(range(20)))
    cmd = ["watch", "--log", str(log), "--preset", "nanogpt", "--db", str(db), "--poll", "0.1"]
    watcher = spawn(cmd, db)
    try:
        wait_for("the log's 20 steps", lambda: live_steps(db, "train") == list(range(20)))
        with log.open("a") as fh:
            fh.write(nanogpt_lines(range(20, 21), nan_at=20))

        def nonfinite() -> bool:
            with Store(db) as store:
                found = store.anomalies("train")
            hit = found["detector"].str.contains("nonfinite") & (found["start_step"] == 20)
            return bool(hit.any())

        wait_for("a nonfinite anomaly at step 20", nonfinite)

        def saved_to_the_end() -> bool:  # kill after the save: see the TensorBoard test
            path = state_path(str(db), str(log))
            saved = json.loads(path.read_text())["source"] if path.exists() else {}
            return saved.get("offset") == log.stat().st_size

        wait_for("the saved position at the end of the log", saved_to_the_end)
        watcher.kill()
        watcher.wait()
        with log.open("a") as fh:
            fh.write(nanogpt_lines(range(21, 30)))
        watcher = spawn(cmd, db)
        wait_for("steps 21..29", lambda: live_steps(db, "train") == list(range(30)))
        stop(watcher, db)
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait()
    with Store(db) as store:
        rows = store.read_points("train", ["loss"], all_attempts=True)
    assert rows["step"].tolist() == list(range(30))  # each line once across the kill


def test_watch_needs_a_source(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "runwatch.cli", "watch", "--db", str(tmp_path / "x.db")],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
    assert "give the TensorBoard LOGDIR" in out.stderr


def test_watch_sends_the_nan_to_the_webhook(tmp_path: Path) -> None:
    bodies: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            """Quiet: the test reads the bodies it received, not the server's log."""

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    root, db = tmp_path / "logs", tmp_path / "watch.db"
    writer = torch_tb.SummaryWriter(str(root / "a"), flush_secs=3600)
    url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    watcher = start_watcher(root, db, "--webhook", url)
    try:
        write(writer, range(10))
        write(writer, range(10, 11), nan_at=10)

        def alerted() -> bool:
            alerts = [a for body in bodies for a in body.get("alerts", [])]
            return any(a.get("run") == "a" and a.get("metric") == "loss" for a in alerts)

        wait_for("an alert on run a's NaN loss", alerted)
        stop(watcher, db)
    finally:
        writer.close()
        server.shutdown()
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait()
    assert "non-finite" in json.dumps(bodies)
