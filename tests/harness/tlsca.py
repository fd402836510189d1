"""A certificate authority made at test time with the `openssl` CLI: no key is ever committed.

`CA(dir, name)` makes a CA; `ca.issue(name, server=..., client=...)` a key and certificate signed
by it (a server certificate for 127.0.0.1 and localhost, or a client certificate naming a node in
its CN and DNS subjectAltName, or both for a node's agent that serves HTTPS). Each call returns the files' paths.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

OPENSSL = shutil.which("openssl")


def need_openssl() -> str:
    if OPENSSL is None:
        pytest.skip("the openssl CLI is not installed: the TLS tests make their CA with it")
    return OPENSSL


def _run(*args: str, cwd: Path) -> None:
    r = subprocess.run([need_openssl(), *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise AssertionError(f"openssl {' '.join(args)} failed:\n{r.stderr}")


@dataclass(frozen=True)
class Issued:
    cert: Path
    key: Path


class CA:
    def __init__(self, directory: Path, name: str = "podhealth test CA") -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.key = self.dir / "ca.key"
        self.cert = self.dir / "ca.crt"
        self._serial = 1
        _run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", str(self.key), "-out", str(self.cert), "-days", "2", "-subj", f"/CN={name}",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             cwd=self.dir)

    def issue(self, name: str, *, server: bool = False, client: bool = False, stem: str = "",
              loopback: bool = True) -> Issued:
        """`loopback=False`: a server certificate naming only `name` (a node's, which callers on
        127.0.0.1 verify by the node name)."""
        stem = stem or name
        key, csr, crt, ext = (self.dir / f"{stem}.{x}" for x in ("key", "csr", "crt", "ext"))
        sans = ["DNS:localhost", "IP:127.0.0.1"] if server and loopback else []
        sans.append(f"DNS:{name}")
        usage = ",".join([*(["serverAuth"] if server else []), *(["clientAuth"] if client else [])])
        ext.write_text(f"subjectAltName={','.join(sans)}\nextendedKeyUsage={usage}\n"
                       "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n")
        _run("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={name}", cwd=self.dir)
        self._serial += 1
        _run("x509", "-req", "-in", str(csr), "-CA", str(self.cert), "-CAkey", str(self.key),
             "-set_serial", str(self._serial), "-days", "2", "-extfile", str(ext), "-out", str(crt), cwd=self.dir)
        key.chmod(0o600)
        return Issued(crt, key)
