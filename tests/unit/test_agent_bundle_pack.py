"""The evidence bundle's archive (agent/bundle.pack): bounded whatever the parts hold, every part
listed in the manifest with its size and sha256, cut parts marked, logs cut from the front."""

from __future__ import annotations

import hashlib
import io
import json
import os
import sys
import tarfile

import pytest

from podhealth.agent.bundle import MAX_BYTES, Part, pack, run_command

pytestmark = pytest.mark.timeout(60)


def members(blob: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]


def test_incompressible_parts_stay_under_the_cap_and_the_manifest_hashes_what_is_there() -> None:
    parts = [Part(f"p{i}.bin", os.urandom(3 * 1024 * 1024)) for i in range(5)]  # 15 MiB of noise
    blob, manifest = pack(parts, {"node": "dgx01", "created": 1.0})
    assert len(blob) <= MAX_BYTES
    files = members(blob)
    assert set(files) == {f"p{i}.bin" for i in range(5)} | {"manifest.json"}
    assert json.loads(files["manifest.json"]) == manifest
    for e in manifest["parts"]:
        assert hashlib.sha256(files[e["name"]]).hexdigest() == e["sha256"] and len(files[e["name"]]) == e["bytes"]
        assert e["truncated"] and e["original_bytes"] == 3 * 1024 * 1024
    assert b"podhealth: part cut at" in files["p0.bin"]
    assert sum(e["bytes"] for e in manifest["parts"]) <= MAX_BYTES


def test_small_parts_are_kept_whole_and_a_log_is_cut_from_the_front() -> None:
    log = b"".join(b"line %d\n" % i for i in range(100_000))
    blob, manifest = pack([Part("a.txt", b"hello\n"), Part("dmesg.txt", log, tail=True)], {"created": 2.0},
                          part_max=10_000)
    files = members(blob)
    assert files["a.txt"] == b"hello\n" and not manifest["parts"][0]["truncated"]
    assert len(files["dmesg.txt"]) <= 10_000 and files["dmesg.txt"].endswith(b"line 99999\n")
    assert files["dmesg.txt"].startswith(b"\n[... podhealth: part cut")


def test_the_same_parts_give_the_same_bytes() -> None:
    parts = [Part("a.txt", b"x" * 1000)]
    assert pack(parts, {"created": 3.0})[0] == pack(parts, {"created": 3.0})[0]


def test_a_missing_or_failing_command_is_a_note_not_an_error() -> None:
    out, note = run_command(("podhealth-no-such-binary-xyz", "-q"))
    assert out == b"" and "not installed" in note
    out, note = run_command((sys.executable, "-c", "import sys; print('half'); sys.exit(3)"))
    assert out == b"half\n" and "exited 3" in note
    out, note = run_command((sys.executable, "-c", "import time; time.sleep(30)"), timeout=0.5)
    assert out == b"" and "killed" in note
