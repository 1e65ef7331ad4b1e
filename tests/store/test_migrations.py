"""Forward migrations: a store made by an older runwatch opens, migrated, with its data."""

from __future__ import annotations

import sqlite3

import numpy as np
import pandas as pd

from runwatch.store import open_store
from runwatch.store.schema import MIGRATIONS, SCHEMA_VERSION


def test_a_version_1_store_is_migrated_in_place_keeping_its_data(db_path):
    conn = sqlite3.connect(db_path)
    conn.executescript(MIGRATIONS[0])
    conn.execute("PRAGMA user_version = 1")
    conn.execute("INSERT INTO runs (name, start_time) VALUES ('old', 1.0)")
    conn.commit()
    conn.close()
    with open_store(str(db_path)) as store:
        assert store.runs()["name"].tolist() == ["old"]
        curve = pd.DataFrame(
            {"step": [1, 10], "expected": [3.0, 2.0], "lower": [2.5, 1.5], "upper": [3.5, 2.5]}
        )
        store.save_expected_curve(store.run_id("old"), "loss", "power_law", 10, 100, curve)
        meta, got = store.expected_curve("old", "loss")
    assert meta == {"model": "power_law", "upto": 10, "final_step": 100}
    assert np.allclose(got["expected"], [3.0, 2.0])
    version = sqlite3.connect(db_path).execute("PRAGMA user_version").fetchone()[0]
    assert version == SCHEMA_VERSION == len(MIGRATIONS)
