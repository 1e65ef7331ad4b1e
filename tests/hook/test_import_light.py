"""The hook stays light: `import runwatch` and a run without the Monitor load none of our
compiled detection cores (only the hook's own compiled gate, ``run.log``'s hot path, and the ring
it writes to), and none
of the heavy packages that detection, the readers or the web stack need
(bench/README-import.md has the figures)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

HOOK_GATE = ["runwatch.hook._log_gate", "runwatch.hook._ring"]
HEAVY = ("pandas", "scipy", "httpx", "streamlit", "plotly", "fastapi", "uvicorn", "yaml")


def _loaded_after(tmp_path, code: str) -> dict[str, list[str]]:
    probe = (
        "import json, sys\n"
        f"{code}\n"
        "mods = sorted(sys.modules)\n"
        "own = [m for m in mods if m.startswith('runwatch')]\n"
        "compiled = [m for m in own\n"
        "            if str(getattr(sys.modules[m], '__file__', '')).endswith(('.so', '.pyd'))]\n"
        "print(json.dumps({'roots': sorted({m.split('.')[0] for m in mods}),\n"
        "                  'compiled': compiled}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path / "light.db")],
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if not k.startswith("RUNWATCH_")},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_runwatch_loads_no_detection_core_and_nothing_heavy(tmp_path):
    loaded = _loaded_after(tmp_path, "import runwatch")
    assert loaded["compiled"] == HOOK_GATE
    assert not set(HEAVY) & set(loaded["roots"])


def test_a_run_without_the_monitor_stays_light(tmp_path):
    loaded = _loaded_after(
        tmp_path,
        "import runwatch\n"
        "run = runwatch.init(name='light', store=sys.argv[1], monitor=False)\n"
        "for step in range(50):\n"
        "    run.log({'loss': 1.0 / (step + 1), 'lr': 3e-4}, step=step)\n"
        "run.finish()",
    )
    assert loaded["compiled"] == HOOK_GATE
    assert not set(HEAVY) & set(loaded["roots"])
