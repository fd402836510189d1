"""The committed XID / SXid catalogs: they parse, are complete, and agree with NVIDIA's sheets."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import yaml

from podhealth.checks.passive.xid import SEVERITIES, CatalogError, load_catalog
from podhealth.vocab import Action

DATA = Path(__file__).resolve().parents[2] / "checks" / "data"


def _yaml(name: str) -> dict:  # type: ignore[type-arg]
    doc = yaml.safe_load((DATA / name).read_text(encoding="utf-8"))
    assert isinstance(doc, dict)
    return doc


def test_xid_yaml_entries_are_complete_and_unique() -> None:
    doc = _yaml("xid_catalog.yaml")
    codes = [x["code"] for x in doc["xids"]]
    assert len(codes) == len(set(codes)), "duplicate codes"
    for x in doc["xids"]:
        assert Action(x["action"]) and x["severity"] in SEVERITIES, x
        assert x["mnemonic"] and "immediate" in x and "investigatory" in x, x
        if x["immediate"] == "":
            assert x.get("note"), f"code {x['code']}: an empty NVIDIA bucket needs our reasoning in `note`"


def test_sxid_yaml_entries_are_complete_and_unique() -> None:
    doc = _yaml("sxid_catalog.yaml")
    codes = [x["code"] for x in doc["sxids"]]
    assert len(codes) == len(set(codes)) == 93
    for x in doc["sxids"]:
        assert Action(x["action"]) and x["severity"] in SEVERITIES, x
        if x["always_fatal"]:
            assert (x["action"], x["severity"]) == ("REBOOT", "critical"), x


def test_loader_builds_every_entry() -> None:
    cat = load_catalog()
    assert len(cat.xids) == 172 and len(cat.sxids) == 93 and len(cat.nvlink5_rows) == 95
    assert cat.lookup(79).action is Action.REBOOT and cat.lookup(79).severity == "critical"
    assert cat.lookup(13).workflow == "xid13_31" and cat.lookup(31).workflow == "xid13_31"
    unknown = cat.lookup(4242)
    assert unknown.unknown and (unknown.action, unknown.severity) == (Action.DRAIN, "warning")
    assert cat.lookup_sxid(99999).unknown and not cat.lookup_sxid(20034).unknown
    assert load_catalog() is load_catalog()  # cached


def test_bad_catalog_names_file_and_entry(tmp_path: Path) -> None:
    text = (DATA / "xid_catalog.yaml").read_text(encoding="utf-8")
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("\n    action: REBOOT\n", "\n    action: REBOOOT\n", 1), encoding="utf-8")
    with pytest.raises(CatalogError, match=r"bad\.yaml: xids\[\d+\] \(code \d+\): action 'REBOOOT'"):
        load_catalog(bad, DATA / "sxid_catalog.yaml")
    dup = tmp_path / "dup.yaml"
    dup.write_text(text.replace("  - code: 2\n", "  - code: 1\n", 1), encoding="utf-8")
    with pytest.raises(CatalogError, match="duplicate code"):
        load_catalog(dup, DATA / "sxid_catalog.yaml")


# ---- against NVIDIA's own sheets (../shared/fixtures/xid_catalog) ---------------------------


def _norm(s: str) -> str:
    return " ".join(s.split())


def test_every_nvidia_xid_is_in_the_catalog_with_its_buckets(shared_fixtures: Path) -> None:
    sheet = shared_fixtures / "xid_catalog" / "nvidia_Xid-Catalog_sheet_Xids.csv"
    with open(sheet, encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f))
    header = [_norm(h) for h in rows[0]]
    col = {name: header.index(name) for name in (
        "Code", "Mnemonic", "Description", "Resolution Bucket (Immediate Action)",
        "Resolution Bucket (Investigatory Action)")}
    cat = load_catalog()
    codes = []
    for r in rows[1:]:
        if not r[col["Code"]].strip():
            continue
        code = int(r[col["Code"]])
        codes.append(code)
        info = cat.lookup(code)
        assert not info.unknown, f"XID {code} missing from the catalog"
        assert info.mnemonic == _norm(r[col["Mnemonic"]]), code
        assert info.description == _norm(r[col["Description"]]), code
        assert info.immediate == r[col["Resolution Bucket (Immediate Action)"]].strip(), code
        assert info.investigatory == _norm(r[col["Resolution Bucket (Investigatory Action)"]]), code
    assert len(codes) == 172 and set(codes) == set(cat.xids)


def test_decode_table_matches_nvidia_sheet(shared_fixtures: Path) -> None:
    sheet = shared_fixtures / "xid_catalog" / "nvidia_Xid-Catalog_sheet_Xid144-150_Decode.csv"
    with open(sheet, encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f))[1:]
    cat = load_catalog()
    assert len(rows) == len(cat.nvlink5_rows)
    for r, mine in zip(rows, cat.nvlink5_rows):
        assert (int(r[0]), r[1].strip(), r[5].strip()) == (mine.xid, mine.unit, mine.bucket)
        statuses = tuple(int(s, 16) for s in r[4].split("/") if s.strip())
        assert statuses == mine.status


def test_every_fabric_manager_sxid_is_in_the_catalog(shared_fixtures: Path) -> None:
    sheet = shared_fixtures / "xid_catalog" / "sxid_catalog_nvswitch_fabric_manager_guide.csv"
    with open(sheet, encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    cat = load_catalog()
    for r in rows:
        info = cat.lookup_sxid(int(r["sxid"]))
        assert not info.unknown and info.name == r["name"].strip()
        assert info.always_fatal == (r["always_fatal"] == "true")
        assert info.potential_fatal == (r["potential_fatal"] == "true")
        # Fatal classes ask for a reboot and fence; non-fatal ones never fence on their own.
        if r["potential_fatal"] == "true" and r["section"].startswith(("Fatal", "Always")):
            assert (info.action, info.severity) == (Action.REBOOT, "critical"), r["sxid"]
        if r["section"].startswith("Non-Fatal"):
            assert info.severity != "critical", r["sxid"]
