"""Commands that need an extra (dashboard, server) say which one when it is missing.

Each test runs the CLI in a fresh interpreter where the extra's packages are made
unimportable (``sys.modules[name] = None``, which is how Python marks a module that must not
be imported), so nothing is uninstalled and nothing heavy is loaded.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from runwatch.extras import EXTRAS, MissingExtra, missing, require

HIDE = ("streamlit", "plotly", "fastapi", "uvicorn", "starlette", "pydantic")


def _cli(tmp_path, *argv: str, hide: tuple[str, ...] = HIDE) -> subprocess.CompletedProcess:
    code = (
        "import sys\n"
        f"for name in {hide!r}:\n"
        "    sys.modules[name] = None\n"
        "from runwatch.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code, *argv],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    ("argv", "extra"),
    [
        (("dashboard", "--no-browser"), "dashboard"),
        (("demo",), "dashboard"),
        (("serve", "--insecure"), "server"),
    ],
)
def test_command_without_its_extra_names_the_extra_and_exits_2(tmp_path, argv, extra):
    out = _cli(tmp_path, *argv, "--db", str(tmp_path / "r.db"))
    assert out.returncode == 2, out.stderr
    assert f"runwatch {argv[0]} needs the {extra} extra" in out.stderr
    assert f"pip install 'runwatch[{extra}]'" in out.stderr
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "r.db").exists()  # stopped before doing anything


def test_core_commands_work_without_any_extra(tmp_path):
    assert _cli(tmp_path, "--help").returncode == 0
    out = _cli(tmp_path, "runs", "--db", str(tmp_path / "none.db"))
    assert out.returncode == 2 and "Traceback" not in out.stderr  # no such store: a usage error
    demo = _cli(tmp_path, "demo", "--no-dashboard", "--steps", "200", "--db", "d.db")
    assert demo.returncode == 0, demo.stderr


def test_only_the_missing_module_is_named(tmp_path):
    out = _cli(tmp_path, "dashboard", "--db", "r.db", hide=("plotly",))
    assert out.returncode == 2
    assert "(plotly not installed)" in out.stderr


def test_require_passes_when_installed_and_refuses_unknown_extras():
    for extra in EXTRAS:
        if not missing(extra):
            require(extra, "x")
    assert issubclass(MissingExtra, ImportError)
    with pytest.raises(KeyError, match="unknown extra"):
        require("gpu-drivers", "x")
