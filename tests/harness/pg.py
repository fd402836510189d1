"""A private PostgreSQL for tests: initdb + postgres on a free loopback port, stopped by PID.

Debian's `postgresql` package puts the server under /usr/lib/postgresql/<major>/bin. PostgreSQL
refuses to run as root, so under root the cluster belongs to the `postgres` system user and the
server runs as that user (Popen(user=...): the PID we hold is the postmaster's own, no su/runuser
process in between). The data directory and the unix socket live in a private temporary folder
that the server's user can reach (pytest's tmp_path under /tmp/pytest-of-root is root-only).

    with PgServer() as pg:
        url = pg.new_database()      # postgresql://postgres@127.0.0.1:PORT/t1
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Iterator, Literal

from tests.harness.proc import free_port, wait_until

SERVER_USER = "postgres"


def pg_bindir() -> Path | None:
    """The newest installed server's bin folder, or None."""
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda d: int(Path(d).parent.name)
                  if Path(d).parent.name.isdigit() else 0)
    for d in reversed(dirs):
        if os.access(Path(d) / "initdb", os.X_OK) and os.access(Path(d) / "postgres", os.X_OK):
            return Path(d)
    return None


def missing() -> str:
    """Why no server can start here ('' when one can)."""
    if pg_bindir() is None:
        return "PostgreSQL is not installed (apt-get install postgresql; scripts/setup.sh --test installs it)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(SERVER_USER)
        except KeyError:
            return f"running as root and there is no {SERVER_USER} user to run PostgreSQL as"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install 'podhealth[postgresql]')"
    return ""


class PgServer:
    def __init__(self) -> None:
        bindir = pg_bindir()
        assert bindir is not None, missing()
        self.bindir = bindir
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="podhealth-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._dbs = 0
        self._as: dict[str, Any] = {}
        if os.geteuid() == 0:
            pw = pwd.getpwnam(SERVER_USER)
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
            self._as = {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}
        os.chmod(self.root, 0o700)

    @property
    def admin_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def url(self, db: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{db}"

    def _run(self, argv: list[str], timeout: float = 60.0) -> None:
        r = subprocess.run(argv, capture_output=True, timeout=timeout, cwd=self.root, **self._as)
        if r.returncode != 0:
            raise AssertionError(f"{argv[0]} failed ({r.returncode}): {r.stderr.decode(errors='replace')[-2000:]}")

    def start(self) -> "PgServer":
        self._run([str(self.bindir / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust",
                   "--encoding=UTF8", "--locale=C", "--no-sync"])
        self.start_server()
        return self

    def start_server(self) -> None:
        """(Re)start the postmaster on the same data and port."""
        log = open(self.log, "ab")
        # fsync off: a test cluster lives for one run; durability is the store's job against a
        # real server, and the tests kill aggregators, not this machine.
        self.proc = subprocess.Popen(
            [str(self.bindir / "postgres"), "-D", str(self.data), "-p", str(self.port), "-k", str(self.root),
             "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "full_page_writes=off",
             "-c", "max_connections=200", "-c", "shared_buffers=64MB"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            cwd=self.root, **self._as)
        log.close()
        wait_until(self._ready, 30.0, what=f"PostgreSQL on port {self.port}\n{self.log_tail()}")

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"postgres exited with {self.proc.returncode}:\n{self.log_tail()}")
        import psycopg
        with psycopg.connect(self.admin_url, connect_timeout=2) as c:
            c.execute("SELECT 1")
        return True

    def log_tail(self, n: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        return ""

    def new_database(self) -> str:
        """A fresh, empty database on this server; its URL."""
        import psycopg
        self._dbs += 1
        name = f"t{self._dbs}"
        with psycopg.connect(self.admin_url, autocommit=True, connect_timeout=5) as c:
            c.execute(f"CREATE DATABASE {name}")  # type: ignore[arg-type]  # a name we made
        return self.url(name)

    def stop_server(self, timeout: float = 10.0) -> None:
        """Stop the postmaster by its PID (fast shutdown, then SIGKILL of its process group)."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            self.proc = None
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGINT)  # PostgreSQL's fast shutdown
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._signal_tree(signal.SIGKILL)
            proc.wait(timeout)
        self.proc = None

    def _tree(self) -> list[int]:
        """The postmaster and its children (each backend calls setsid(): not one process group)."""
        assert self.proc is not None
        pids = [self.proc.pid]
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                with contextlib.suppress(OSError, ValueError, IndexError):
                    # the field after the ")" that closes the command name: state, then ppid
                    if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == self.proc.pid:
                        pids.append(int(d.name))
        return pids

    def _signal_tree(self, sig: int) -> None:
        for pid in self._tree():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def pause(self) -> None:
        """Freeze the whole server (postmaster and every backend) - a partition as the clients
        see it: connections stay open, nothing answers."""
        self._signal_tree(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal_tree(signal.SIGCONT)

    def close(self) -> None:
        try:
            if self.proc is not None and self.proc.poll() is None:
                self.resume()  # a paused server cannot shut down
            self.stop_server()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> "PgServer":
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def pg_server() -> Iterator[PgServer]:
    with PgServer() as s:
        yield s


def pg_fixture(scope: Literal["session", "package", "module", "class", "function"] = "session") -> Any:
    """A pytest fixture yielding a started PgServer; skips clearly when PostgreSQL is missing."""
    import pytest

    @pytest.fixture(scope=scope)
    def _fixture() -> Iterator[PgServer]:
        why = missing()
        if why:
            pytest.skip(why)
        with PgServer() as s:
            yield s

    return _fixture

