"""Family mode through a detecting server: ``runwatch.init(url=..., family=[...])``."""

from __future__ import annotations

import pytest

import runwatch
from runwatch.store import open_store
from tests.hook.test_family_live import deviations, log_run

from .conftest import TOKEN, ServerProcess


def test_family_mode_through_a_detecting_server(db_path, token_file, monkeypatch, tmp_path):
    for i, (name, params) in enumerate((("s", 1e5), ("m", 3e5), ("l", 1e6))):
        log_run(name, params, seed=i, store=db_path, monitor=False)
    family_db = db_path
    monkeypatch.setenv("RUNWATCH_SPILL_DIR", str(tmp_path / "spill"))
    server = ServerProcess(family_db, token_file)
    server.start()
    try:
        log_run(
            "above", 3e6, worse=1.15, seed=8, url=server.url, token=TOKEN, family=["s", "m", "l"]
        )
        with pytest.raises(ValueError, match="family"):
            runwatch.init(name="lost", url=server.url, token=TOKEN, family=["nope"])
    finally:
        server.stop()
    found = deviations(family_db, "above")
    assert (found["severity"] == "warning").any()
    with open_store(str(family_db), readonly=True) as store:
        assert "lost" not in set(store.runs()["name"])
