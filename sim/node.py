"""A simulated DGX node on disk, shared between processes.

A node is a directory `<root>/<name>/`:

    state.json   NodeState (podhealth.sim.state), written atomically (tmp + rename)
    sys/         sysfs tree (class/infiniband ...), written by podhealth.sim.tree_ib
    proc/        procfs tree (self/mountstats, net/rpc/nfs), written by podhealth.sim.tree_nfs
    kmsg.log     kernel log in /dev/kmsg record format ("<prio>,<seq>,<usec>,-;message")
    kmsg.fifo    the same records as a stream, as /dev/kmsg hands them out: written one record per
                 write() while a reader holds it open (the agent reads it like /dev/kmsg, woken by
                 poll, never polling a file); kmsg.log is the ring buffer a new reader starts from
    units.json   systemd unit -> ActiveState, for the host collector

API (stable):

    SimNode.create(root, name, profile="dgx-h100", seed=None) -> SimNode
        seed: a NodeState to start from (e.g. one built from an nvidia-smi capture)
    SimNode.open(root, name) -> SimNode          FileNotFoundError if absent
    node.state -> NodeState                      re-read when state.json's mtime changes (<= every 0.1 s)
    node.dir, node.sys_root, node.proc_root, node.kmsg_path, node.units_path
    node.inject(fault) -> Fault                  validated; ValueError and no change on bad input
    node.clear(kind=None) -> int                 removes faults (all, or of one kind); returns count
    node.refresh(now=None)                       rewrites sys/proc trees, units.json; appends kmsg lines
    node.kmsg_stream                             the FIFO (created on first use)
    node.attach_kmsg_reader(open_fn, from_start) opens a reader on the FIFO; replays the newest records
    node.probe_argv(mount) -> list[str]          a killable `stat` stand-in for the NFS collector
    default_root() -> Path                       $PODHEALTH_SIM_DIR or /tmp/podhealth-sim-$UID
    root_problem(root) -> str | None             why `root` cannot be this user's (another user owns it)

`podhealth simulate inject` in another process changes a running agent's node: the agent's
SimNode sees the new state.json on its next read, and NVML answers change with it.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib
import json
import os
import stat
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Callable, Iterator

from podhealth.hostnames import node_name_problem
from podhealth.sim import faults as faults_mod
from podhealth.sim import tree_imex
from podhealth.sim.state import Fault, NodeState, default_state

ENV_ROOT = "PODHEALTH_SIM_DIR"
_RELOAD_INTERVAL_S = 0.1
# A FIFO's default capacity: what a reader that attaches late gets replayed of kmsg.log (the newest
# records), as /dev/kmsg's ring buffer keeps only the newest.
_STREAM_REPLAY_BYTES = 65536


def default_root() -> Path:
    """$PODHEALTH_SIM_DIR, else /tmp/podhealth-sim-<uid>: one per user, so two people simulating on
    one machine never share nodes, faults or a fleet's database (nor fail on each other's files)."""
    return Path(os.environ.get(ENV_ROOT) or user_root())


def user_root() -> Path:
    """The per-user default root, whatever $PODHEALTH_SIM_DIR says in this shell."""
    return Path(f"/tmp/podhealth-sim-{os.getuid()}")


def root_problem(root: Path) -> str | None:
    """Why `root` cannot hold this user's simulated nodes (another user owns it), or None."""
    try:
        owner = root.stat().st_uid
    except OSError:
        return None  # not there yet: it is created as ours
    if owner != os.getuid():
        return (f"{root} belongs to uid {owner}, not to you (uid {os.getuid()}): pass --root DIR "
                f"or set ${ENV_ROOT}")
    return None


def check_name(name: str) -> str:
    """Node names become directory names and Slurm node names: keep them to a safe alphabet."""
    problem = node_name_problem(name)
    if problem:
        raise ValueError(f"bad node name {name!r}: {problem}")
    return name


def _atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)  # mkstemp makes 0600; the agent may run as another user
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


class SimNode:
    def __init__(self, directory: Path, state: NodeState) -> None:
        self.dir = directory
        self._lock = threading.Lock()
        self._state = state
        self._file_sig = self._file_signature()
        self._checked = time.monotonic()

    # --- construction -------------------------------------------------------------------------

    @classmethod
    def create(cls, root: Path | str, name: str, profile: str = "dgx-h100",
               seed: NodeState | None = None) -> "SimNode":
        """Create (or overwrite) node `name` under `root` and write its trees."""
        check_name(name)
        state = replace(seed, name=name) if seed is not None else default_state(name, profile)
        directory = Path(root) / name
        directory.mkdir(parents=True, exist_ok=True)
        _atomic_write(directory / "state.json", state.dumps())
        kmsg = directory / "kmsg.log"
        kmsg.write_text("", encoding="utf-8")
        (directory / "kmsg.seq").write_text("0", encoding="utf-8")
        (directory / "kmsg.links").unlink(missing_ok=True)  # link lines logged by a previous node
        node = cls(directory, state)
        node._write_delivered(set())
        node.refresh()
        return node

    @classmethod
    def open(cls, root: Path | str, name: str) -> "SimNode":
        check_name(name)
        directory = Path(root) / name
        path = directory / "state.json"
        if not path.is_file():
            raise FileNotFoundError(f"no simulated node {name!r} under {root} (create it with "
                                    f"`podhealth simulate node {name}`)")
        node = cls(directory, NodeState.loads(path.read_text(encoding="utf-8")))
        node._reload_now()  # pairs the content with its file signature, race-free
        return node

    # --- paths --------------------------------------------------------------------------------

    @property
    def state_path(self) -> Path:
        return self.dir / "state.json"

    @property
    def sys_root(self) -> Path:
        return self.dir / "sys"

    @property
    def proc_root(self) -> Path:
        return self.dir / "proc"

    @property
    def kmsg_path(self) -> Path:
        return self.dir / "kmsg.log"

    @property
    def kmsg_stream(self) -> Path:
        return self.dir / "kmsg.fifo"

    def _ensure_stream(self) -> Path:
        path = self.kmsg_stream
        try:
            if stat.S_ISFIFO(path.lstat().st_mode):
                return path
            path.unlink()  # not a FIFO (left by something else): make it one
        except FileNotFoundError:
            pass
        with contextlib.suppress(FileExistsError):  # another process made it meanwhile
            os.mkfifo(path, 0o644)
        return path

    def attach_kmsg_reader(self, open_fn: Callable[[], str], from_start: bool) -> str:
        """Open a reader on the kernel-log stream (`open_fn()` opens it; returns an error or "").
        With `from_start`, the newest records already logged are written to it first, as a new
        /dev/kmsg reader sees the ring buffer; the lock keeps a concurrent writer from either
        missing the new reader or writing a record twice."""
        with self._exclusive():
            self._ensure_stream()
            err = open_fn()
            if err or not from_start:
                return err
            try:
                data = self.kmsg_path.read_bytes()
            except FileNotFoundError:
                return ""
            tail = data[-_STREAM_REPLAY_BYTES:]
            if len(tail) < len(data):
                tail = tail.split(b"\n", 1)[-1]  # whole records only
            self._to_stream([ln.decode("utf-8", "replace") for ln in tail.splitlines() if ln])
            return ""

    def _to_stream(self, lines: list[str]) -> None:
        """Write records to the stream, one per write() (atomic below PIPE_BUF), if a reader is
        attached. A full pipe drops the rest: the reader counts them as lost by the sequence gap,
        as the kernel overwrites records a slow reader did not read."""
        try:
            fd = os.open(self.kmsg_stream, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            # ENXIO: no reader; ENOENT: no stream yet. kmsg.log keeps the records either way, and a
            # broken stream must not make refresh() log them twice.
            return
        try:
            for line in lines:
                os.write(fd, (line + "\n").encode("utf-8")[:4096])
        except OSError:
            return  # EAGAIN: the pipe is full; EPIPE: the reader left while we wrote
        finally:
            os.close(fd)

    @property
    def units_path(self) -> Path:
        return self.dir / "units.json"

    @property
    def name(self) -> str:
        return self.state.name

    def probe_argv(self, mount: str) -> list[str]:
        return [sys.executable, "-m", "podhealth.sim.nfsprobe", str(self.dir), mount]

    # --- state --------------------------------------------------------------------------------

    def _file_signature(self) -> tuple[int, int, int]:
        # mtime alone can miss a rewrite within one timer tick; every write is a new inode (rename).
        try:
            st = self.state_path.stat()
        except FileNotFoundError:
            return (0, 0, 0)
        return (st.st_mtime_ns, st.st_ino, st.st_size)

    @property
    def state(self) -> NodeState:
        """The current state; re-read from disk when another process has rewritten it."""
        now = time.monotonic()
        with self._lock:
            if now - self._checked >= _RELOAD_INTERVAL_S:
                self._checked = now
                sig = self._file_signature()
                if sig != self._file_sig:
                    try:
                        self._state = NodeState.loads(self.state_path.read_text(encoding="utf-8"))
                        self._file_sig = sig
                    except (OSError, ValueError, KeyError, TypeError):
                        pass  # a half-visible or broken file: keep the last good state
            return self._state

    def _reload_now(self) -> NodeState:
        with self._lock:
            sig = self._file_signature()  # before reading: a later rewrite then shows as a change
            self._state = NodeState.loads(self.state_path.read_text(encoding="utf-8"))
            self._file_sig = sig
            self._checked = time.monotonic()
            return self._state

    def _save(self, state: NodeState) -> None:
        with self._lock:
            _atomic_write(self.state_path, state.dumps())
            self._state = state
            self._file_sig = self._file_signature()
            self._checked = time.monotonic()

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        """Serialise read-modify-write of the node's files across processes (CLI vs agent)."""
        with open(self.dir / ".lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def inject(self, fault: Fault) -> Fault:
        """Add `fault` (validated against this node) and refresh the trees and kernel log."""
        with self._exclusive():
            state = self._reload_now()
            faults_mod.validate(fault, state)
            if fault.kind == "reboot":  # what a boot leaves: only the faults that survive one
                state = replace(state, faults=faults_mod.after_reboot(state.faults))
            state = state.with_fault(fault)
            self._save(state)
        self.refresh(now=fault.injected_at)
        return state.faults[-1]

    def reset_gpu(self, index: int) -> bool:
        """`nvidia-smi -r -i index` on this node: clears the GPU's resettable faults (True), or
        fails and changes nothing (False) when the GPU cannot be reset (faults.after_reset)."""
        with self._exclusive():
            state = self._reload_now()
            state.gpu(index)  # KeyError: no such GPU
            left = faults_mod.after_reset(state.faults, index)
            if left is None:
                return False
            if left != state.faults:
                self._save(replace(state, faults=left))
        self.refresh()
        return True

    def clear(self, kind: str | None = None) -> int:
        """Remove all faults, or those of one kind; returns how many were removed."""
        if kind is not None:
            faults_mod.check_kind(kind)
        with self._exclusive():
            state = self._reload_now()
            keep = tuple(f for f in state.faults if kind is not None and f.kind != kind)
            removed = len(state.faults) - len(keep)
            if removed:
                self._save(replace(state, faults=keep))
        self.refresh()
        return removed

    # --- derived files ------------------------------------------------------------------------

    def refresh(self, now: float | None = None) -> None:
        """Rewrite the sysfs/procfs trees and units.json, and log kernel lines for new faults."""
        with self._exclusive():
            self._refresh_locked(time.time() if now is None else now)

    def _refresh_locked(self, now: float) -> None:
        state = self._reload_now()
        for module_name, root in (("tree_ib", self.sys_root), ("tree_nfs", self.proc_root),
                                  ("tree_proc", self.proc_root), ("tree_host", self.sys_root)):
            module = _tree_module(module_name)
            if module is not None:
                root.mkdir(parents=True, exist_ok=True)
                module.write(state, root, now)
        units = dict(state.units)
        for f in state.faults_of("unit-down"):
            if f.unit is not None:
                units[f.unit] = "failed"
        _atomic_write(self.units_path, json.dumps(units, indent=1, sort_keys=True))
        tree_imex.write(state, self.dir)
        self._write_boot_id(state)
        self._log_new_faults(state)
        self._log_link_events(state, now)

    def _write_boot_id(self, state: NodeState) -> None:
        """proc/sys/kernel/random/boot_id: one per simulated boot (the node's t0), as the kernel's
        changes on every boot and only then; the agent orders what it sends by it."""
        path = self.proc_root / "sys" / "kernel" / "random" / "boot_id"
        text = str(uuid.uuid5(uuid.NAMESPACE_URL, f"podhealth-sim:{state.name}:{state.t0!r}")) + "\n"
        with contextlib.suppress(FileNotFoundError):
            if path.read_text(encoding="ascii") == text:
                return
        path.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write(path, text)

    def _delivered_path(self) -> Path:
        return self.dir / "kmsg.faults"

    def _read_delivered(self) -> set[int]:
        try:
            text = self._delivered_path().read_text(encoding="utf-8")
        except FileNotFoundError:
            return set()
        return {int(x) for x in text.split() if x.isdigit()}

    def _write_delivered(self, seqs: set[int]) -> None:
        _atomic_write(self._delivered_path(), " ".join(map(str, sorted(seqs))))

    def _log_new_faults(self, state: NodeState) -> None:
        from podhealth.sim import kmsg_lines

        done = self._read_delivered()
        new = [f for f in state.faults if f.seq not in done and f.kind in kmsg_lines.LOGGED_KINDS]
        if not new:
            return
        seq_path = self.dir / "kmsg.seq"
        try:
            seq = int(seq_path.read_text(encoding="utf-8").strip() or 0)
        except (FileNotFoundError, ValueError):
            seq = 0
        lines: list[str] = []
        for f in sorted(new, key=lambda f: f.seq):
            records = kmsg_lines.lines_for(state, f, boot_time=state.t0, first_seq=seq + 1)
            seq += len(records)
            lines.extend(records)
        with open(self.kmsg_path, "a", encoding="utf-8") as out:
            out.write("".join(line + "\n" for line in lines))
        seq_path.write_text(str(seq), encoding="utf-8")
        self._to_stream(lines)
        self._write_delivered(done | {f.seq for f in new})


    def _log_link_events(self, state: NodeState, now: float) -> None:
        """mlx5's `Port: 1 Link DOWN/ACTIVE` lines for IB link faults, each when its transition
        time has passed (a flap logs as it goes), once: logged keys are kept in kmsg.links."""
        from podhealth.sim import kmsg_lines

        events = kmsg_lines.link_events(state, now)
        if not events:
            return
        path = self.dir / "kmsg.links"
        try:
            done = set(path.read_text(encoding="utf-8").split())
        except FileNotFoundError:
            done = set()
        new = [e for e in events if e[0] not in done]
        if not new:
            return
        seq_path = self.dir / "kmsg.seq"
        try:
            seq = int(seq_path.read_text(encoding="utf-8").strip() or 0)
        except (FileNotFoundError, ValueError):
            seq = 0
        lines = []
        for key, at, prio, message in new:
            seq += 1
            lines.append(kmsg_lines.record(prio, seq, max(0, int((at - state.t0) * 1_000_000)), message))
        with open(self.kmsg_path, "a", encoding="utf-8") as out:
            out.write("".join(line + "\n" for line in lines))
        seq_path.write_text(str(seq), encoding="utf-8")
        self._to_stream(lines)
        _atomic_write(path, " ".join(sorted(done | {e[0] for e in new})))


_TREE_WARNED: set[str] = set()


def _tree_module(name: str) -> ModuleType | None:
    """podhealth.sim.tree_ib / tree_nfs are written separately; until they exist, say so once."""
    try:
        return importlib.import_module(f"podhealth.sim.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"podhealth.sim.{name}":
            raise
        if name not in _TREE_WARNED:
            _TREE_WARNED.add(name)
            print(f"podhealth.sim: podhealth.sim.{name} is not available yet; "
                  f"its tree is not written", file=sys.stderr)
        return None


def list_nodes(root: Path | str) -> list[str]:
    base = Path(root)
    if not base.is_dir():
        return []
    return sorted(p.name for p in base.iterdir() if (p / "state.json").is_file())
