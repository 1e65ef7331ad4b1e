"""A throwaway PostgreSQL cluster in a temporary directory, for tests and benches.

``initdb`` and ``postgres`` refuse to run as root, so as root the cluster runs as ``nobody``
(the data directory is chowned to it). It listens on 127.0.0.1 on a free port with password
(scram) authentication, so a wrong password fails as it would on a real server; the unix
socket in the temporary directory trusts local users and is used only to create the role.
"""

from __future__ import annotations

import glob
import logging
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import Any

log = logging.getLogger("runwatch.store.postgres_local")


def find_bindir() -> Path | None:
    """The newest installed ``/usr/lib/postgresql/*/bin`` holding ``initdb``, or None."""

    def version(initdb: str) -> int:
        name = Path(initdb).parent.parent.name
        return int(name) if name.isdigit() else 0

    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=version)
    return Path(found[-1]).parent if found else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LocalCluster:
    """``initdb`` + ``pg_ctl start`` in a temp dir; :meth:`stop` removes everything.

    ``fsync=False`` is for tests only (a crash of the machine may lose commits); benches that
    report durable figures keep it on.
    """

    def __init__(self, *, fsync: bool = True, user: str = "runwatch") -> None:
        bindir = find_bindir()
        if bindir is None:
            raise RuntimeError(
                "PostgreSQL server binaries not found (/usr/lib/postgresql/*/bin/initdb); "
                "install Debian's `postgresql` package"
            )
        self.bindir = bindir
        self.user = user
        self.password = secrets.token_hex(12)
        self.port = _free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="runwatch-pg-"))
        self.data = self.dir / "data"
        self._fsync = fsync
        self._as: dict[str, Any] = {}
        if os.geteuid() == 0:
            nobody = pwd.getpwnam("nobody")
            os.chown(self.dir, nobody.pw_uid, nobody.pw_gid)
            self._as = {"user": nobody.pw_uid, "group": nobody.pw_gid, "extra_groups": []}
        self._started = False

    def _run(self, *args: str) -> None:
        done = subprocess.run(args, capture_output=True, text=True, check=False, **self._as)
        if done.returncode != 0:
            raise RuntimeError(f"{args[0]} failed ({done.returncode}): {done.stderr.strip()}")

    def start(self) -> LocalCluster:
        self._run(
            str(self.bindir / "initdb"),
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "-E",
            "UTF8",
            "--locale=C",
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
            "-N",
        )
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(
                f"\nlisten_addresses = '127.0.0.1'\nport = {self.port}\n"
                f"unix_socket_directories = '{self.dir}'\nmax_connections = 200\n"
                + ("" if self._fsync else "fsync = off\nsynchronous_commit = off\n")
            )
        self._run(
            str(self.bindir / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.dir / "log"),
            "-w",
            "-t",
            "60",
            "start",
        )
        self._started = True
        self.admin(f"CREATE ROLE {self.user} LOGIN CREATEDB PASSWORD '{self.password}'")
        return self

    def admin(self, sql: str, dbname: str = "postgres") -> None:
        """Run one statement as the superuser over the trusted unix socket."""
        import psycopg

        with psycopg.connect(
            host=str(self.dir), port=self.port, user="postgres", dbname=dbname, autocommit=True
        ) as conn:
            conn.execute(sql)  # type: ignore[arg-type]

    def url(self, dbname: str, *, password: str | None = None) -> str:
        pw = self.password if password is None else password
        return f"postgresql://{self.user}:{pw}@127.0.0.1:{self.port}/{dbname}"

    def create_database(self, dbname: str) -> str:
        """A new empty database owned by the test role; returns its URL."""
        self.admin(f"CREATE DATABASE {dbname} OWNER {self.user}")
        return self.url(dbname)

    def drop_database(self, dbname: str) -> None:
        self.admin(f"DROP DATABASE IF EXISTS {dbname} WITH (FORCE)")

    def pause(self) -> None:
        """Stop the server at once, as a crash would, keeping its data for ``resume``."""
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop")

    def resume(self) -> None:
        """Start the paused server again on the same port and data."""
        pg_ctl = str(self.bindir / "pg_ctl")
        self._run(pg_ctl, "-D", str(self.data), "-l", str(self.dir / "log"), "-w", "start")

    def stop(self) -> None:
        if self._started:
            try:
                pg_ctl = str(self.bindir / "pg_ctl")
                self._run(pg_ctl, "-D", str(self.data), "-m", "immediate", "stop")
            except RuntimeError as exc:  # pragma: no cover - left for the temp dir cleanup
                log.warning("stopping the test cluster: %s", exc)
            self._started = False
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
