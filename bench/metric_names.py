"""Roles from real framework metric names (issue 24): accuracy per framework, look-alikes
taken for a watched role, and the cost of a lookup, against the code before.

    python bench/metric_names.py

The names and the roles they should get are ``tests/detect/data/framework_metric_names.csv``
(412 names, each with its source). "before" is ``role_of`` from the commit before issue 24
(e41d167, loaded from git), whose rules were a short list of exact names and patterns; it
knew no ``loss_scale``/``counter``/``index`` roles and no direction for ``other``, so a
name it calls ``other`` counts as right for those. A lookup happens once per series (when
the Monitor first sees it); ``run.log`` never makes one.
"""

from __future__ import annotations

import csv
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runwatch.detect.names import role_from_name, worse_direction  # noqa: E402

TABLE = ROOT / "tests/detect/data/framework_metric_names.csv"
BEFORE = "e41d167"
WATCHED = ("loss", "grad_norm", "lr")
NEW_ROLES = ("loss_scale", "counter", "index", "other", "other:up", "other:down")


def _now(name: str) -> str:
    role = role_from_name(name)
    if role != "other":
        return role
    direction = worse_direction(name)
    return "other" if direction is None else f"other:{direction}"


def _before():
    source = subprocess.run(
        ["git", "show", f"{BEFORE}:runwatch/detect/roles.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    path = Path(tempfile.mkdtemp()) / "roles_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("roles_before", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.role_of


def _right(expected: str, got: str, old: bool) -> bool:
    if old and expected in NEW_ROLES:
        return got == "other"
    return got == expected


def _cost_us(fn, names: list[str], repeats: int = 7) -> tuple[float, float, float]:
    per = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for name in names:
            fn(name)
        per.append((time.perf_counter() - t0) / len(names) * 1e6)
    return statistics.median(per), min(per), max(per)


def main() -> None:
    rows = list(csv.DictReader(TABLE.open()))
    before = _before()
    frameworks = sorted({r["framework"] for r in rows})
    print("| framework | names | now right | before right |")
    print("|---|---|---|---|")
    total_now = total_before = 0
    for fw in frameworks:
        mine = [r for r in rows if r["framework"] == fw]
        now = sum(_right(r["role"], _now(r["name"]), False) for r in mine)
        old = sum(_right(r["role"], before(r["name"]), True) for r in mine)
        total_now, total_before = total_now + now, total_before + old
        print(f"| {fw} | {len(mine)} | {now / len(mine):.0%} | {old / len(mine):.0%} |")
    n = len(rows)
    print(f"| **all** | {n} | **{total_now / n:.1%}** | {total_before / n:.1%} |")
    looks = [r for r in rows if r["role"] in NEW_ROLES]
    taken_now = [r["name"] for r in looks if _now(r["name"]) in WATCHED]
    taken_before = [r["name"] for r in looks if before(r["name"]) in WATCHED]
    print(f"\nLook-alikes ({len(looks)}) taken for loss, grad norm or LR: now {len(taken_now)}")
    print(f"{taken_now}; before {len(taken_before)} {taken_before}")
    wrong = [(r["name"], r["role"], _now(r["name"])) for r in rows]
    wrong = [w for w in wrong if w[1] != w[2]]
    print(f"\nNames still missed now ({len(wrong)}): {wrong}")
    names = [r["name"] for r in rows]
    now_cost, before_cost = _cost_us(role_from_name, names), _cost_us(before, names)
    print("\n| role lookup, one name | median µs | range (7 repeats) |")
    print("|---|---|---|")
    print(f"| now | {now_cost[0]:.2f} | {now_cost[1]:.2f}-{now_cost[2]:.2f} |")
    print(
        f"| before ({BEFORE}) | {before_cost[0]:.2f} | {before_cost[1]:.2f}-{before_cost[2]:.2f} |"
    )


if __name__ == "__main__":
    main()
