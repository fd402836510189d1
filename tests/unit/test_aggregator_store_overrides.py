"""The store's part of overrides and evidence (migration 8), on both backends: silences are
upserted, loaded at start and deleted; bundles keep the newest `keep` per node and hand back the
paths of the rows they dropped."""

from __future__ import annotations

from pathlib import Path

import pytest

from podhealth.aggregator.model import Silence
from podhealth.aggregator.store import Store
from tests.unit.test_aggregator_store import Where, db, pg  # noqa: F401 - fixtures

pytestmark = pytest.mark.timeout(120)


def test_silences_round_trip(db: Where) -> None:  # noqa: F811
    s = Store(db("a"))
    try:
        s.apply([Store.op_silence(Silence("dgx01", "xid", 100.0, "cable", "ana", 1.0)),
                 Store.op_silence(Silence("dgx02", "nfs_mount", 200.0, "maint", "bo", 2.0))])
        s.apply([Store.op_silence(Silence("dgx01", "xid", 300.0, "longer", "cy", 3.0))])  # replaces, not a second
        assert s.silences() == (Silence("dgx01", "xid", 300.0, "longer", "cy", 3.0),
                                Silence("dgx02", "nfs_mount", 200.0, "maint", "bo", 2.0))
        assert s.load(10.0, 3600.0).silences == s.silences()
        s.apply([Store.op_unsilence("dgx01", "xid")])
        assert [x.node for x in s.silences()] == ["dgx02"]
    finally:
        s.close()


def test_bundles_keep_the_newest_per_node(db: Where, tmp_path: Path) -> None:  # noqa: F811
    s = Store(db("b"))
    try:
        got = [s.add_bundle("dgx01", 10 + i, float(i), 100 + i, f"{i:064x}", f"/b/dgx01/{10 + i}.tar.gz", keep=2)
               for i in range(4)]
        s.add_bundle("dgx02", 99, 5.0, 7, "f" * 64, "/b/dgx02/99.tar.gz", keep=2)
        assert [d for _, d in got] == [[], [], ["/b/dgx01/10.tar.gz"], ["/b/dgx01/11.tar.gz"]]
        rows = s.bundles_of("dgx01")
        assert [r["fence_id"] for r in rows] == [13, 12] and rows[0]["size"] == 103
        assert s.bundle(got[3][0]) == rows[0] and s.bundle(got[0][0]) is None
        assert [r["fence_id"] for r in s.bundles_of("dgx02")] == [99]
    finally:
        s.close()
