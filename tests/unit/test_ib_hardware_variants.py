"""InfiniBand on hardware the shipped trees do not show: RoCE rails, spare adapters that are down,
counters that saturate at 16 or 32 bits or count wider, counters that go back (a reset), missing
counter directories, files that cannot be read or hold junk, and link rates the project has not
met. Each case goes through the real collector over a tree in mlx5's formats and the real checks;
the rule throughout: nothing here may FAIL a healthy node, and nothing may crash.
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path
from typing import Callable

import pytest

from podhealth.checks import profiles
from podhealth.checks.passive import ib
from podhealth.checks.passive.context import Context, observe_counters
from podhealth.checks.passive.ib_links import LinkTracker
from podhealth.checks.passive.rates import RateTracker
from podhealth.checks.profiles import Profile
from podhealth.collectors import infiniband
from podhealth.collectors.base import SourceUnreadable
from podhealth.collectors.ib_parse import is_kernel_fallback_rate, parse_rate
from podhealth.collectors.infiniband import InfinibandCollector
from podhealth.snapshot import CollectorState, Snapshot
from podhealth.vocab import CheckResult, Status
from tests.harness.ibtree import Hca, Port, dgx_h100, write_tree

H100 = profiles.load("dgx-h100")
T0 = 1_700_000_000.0
_COUNTERS = frozenset({"infiniband_port_stat", "infiniband_port_hw_stat"})
Step = tuple[float, list[Hca]]
Results = dict[tuple[str, str], CheckResult]


def _run(tmp: Path, steps: list[Step], profile: Profile = H100, history: bool = True,
         mutate: Callable[[Path], None] | None = None) -> tuple[Results, tuple[str, ...]]:
    """ib_port, ib_errors and ib_flap after the last step (each step a fresh tree read at its
    time, counters and link history carried across like the agent's Evaluator does)."""
    rates, links = RateTracker(3600), LinkTracker() if history else None
    res: list[CheckResult] = []
    errors: tuple[str, ...] = ()
    for i, (t, hcas) in enumerate(steps):
        root = write_tree(tmp / str(i) / "sys", hcas)
        if mutate is not None:
            mutate(root)
        c = InfinibandCollector(root).collect()
        errors = c.errors
        observe_counters(rates, c.samples, t, _COUNTERS)
        st = CollectorState("infiniband", samples=c.samples, stale=False, last_success=t, last_attempt=t)
        ctx = Context(snapshot=Snapshot(t, {"infiniband": st}), profile=profile, now=t, rates=rates, ib_links=links,
                      window=3600.0)
        if links is not None:
            ib.observe_links(links, ctx)
        res = ib.ib_port(ctx) + ib.ib_errors(ctx) + ib.ib_flap(ctx)
    return {(r.check, r.entity): r for r in res}, errors


def _fails(res: Results) -> list[tuple[str, str]]:
    return sorted(k for k, r in res.items() if r.status is Status.FAIL)


def _node(edit: Callable[[list[Hca]], None] | None = None) -> list[Hca]:
    hcas = dgx_h100("bond")
    if edit is not None:
        edit(hcas)
    return hcas


# --- RoCE and bonds ----------------------------------------------------------------------------


def _roce(hcas: list[Hca]) -> None:
    for h in hcas:
        for p in h.ports.values():
            p.link_layer = "Ethernet"


def test_roce_rails_on_an_infiniband_profile_are_unknown_not_eight_missing(tmp_path: Path) -> None:
    """Same ConnectX-7 adapters, link_layer Ethernet (a RoCE/Spectrum-X build): the stock DGX
    profile expects InfiniBand rails. Every node of the build would lose all 8 alike: the
    profile is wrong for the build, no node is at fault."""
    res, _ = _run(tmp_path, [(T0, _node(_roce))])
    r = res[("ib_port", "role/compute")]
    assert r.status is Status.UNKNOWN and "network.roles" in r.summary
    assert dict(r.evidence)["other_link_layer"].split() == [f"{d}/1" for d in
                                                            ("mlx5_0", "mlx5_1", "mlx5_4", "mlx5_5", "mlx5_6",
                                                             "mlx5_7", "mlx5_8", "mlx5_9")]
    assert _fails(res) == []


def test_roce_rails_with_a_profile_that_says_so_are_judged(tmp_path: Path) -> None:
    site = profiles.load("dgx-h100", {"network.roles.compute.link_layers": ["Ethernet"],
                                      "network.rules": [{"role": "storage", "bonded": True},
                                                        {"role": "compute", "dual_port": False}]})

    def one_down(hcas: list[Hca]) -> None:
        _roce(hcas)
        hcas[2].ports[1].state, hcas[2].ports[1].phys_state = "1: DOWN", "3: Disabled"

    res, _ = _run(tmp_path, [(T0, _node(one_down))], site, history=False)
    assert res[("ib_port", "role/compute")].status is Status.OK
    assert _fails(res) == [("ib_port", "mlx5_4/1")]  # a rail down, judged once the profile fits


def test_one_rail_turned_ethernet_among_infiniband_ones_still_fails_the_count(tmp_path: Path) -> None:
    """The RoCE allowance needs the whole role on another link layer: one adapter flipped to
    Ethernet (mlxconfig LINK_TYPE) on an InfiniBand node is a rail lost to the fabric."""
    def flip(hcas: list[Hca]) -> None:
        hcas[0].ports[1].link_layer = "Ethernet"

    res, _ = _run(tmp_path, [(T0, _node(flip))])
    assert res[("ib_port", "role/compute")].status is Status.FAIL


def test_bonded_ethernet_storage_next_to_infiniband_rails_is_healthy(tmp_path: Path) -> None:
    res, errors = _run(tmp_path, [(T0, _node())])
    assert errors == ()
    assert [k for k, r in res.items() if r.status is not Status.OK] == []
    assert dict(res[("ib_port", "mlx5_bond_0/1")].evidence)["bond_slaves"] == "enp170s0f0np0 enp170s0f1np1"


# --- down ports: spare adapters vs rails -------------------------------------------------------


def _spare(single: bool) -> Callable[[list[Hca]], None]:
    def add(hcas: list[Hca]) -> None:
        down = {1: Port(state="1: DOWN", phys_state="2: Polling", rate="10 Gb/sec (4X SDR)")}
        if single:  # a ninth single-port card in a spare slot: the compute rule takes it
            hcas.append(Hca("mlx5_10", pci="0000:bb:00.0", numa=1, netdev="ibpbbs0", ports=down))
        else:  # an unused dual-port card: the storage rule takes both functions
            hcas.append(Hca("mlx5_10", pci="0000:bb:00.0", numa=1, netdev="ibpbbs0f0", ports=down))
            hcas.append(Hca("mlx5_11", pci="0000:bb:00.1", numa=1, netdev="ibpbbs0f1",
                            ports={1: Port(state="1: DOWN", phys_state="3: Disabled", rate="10 Gb/sec (4X SDR)")}))
    return add


@pytest.mark.parametrize("single", [True, False])
def test_down_spare_adapter_is_not_a_fault_even_after_down_max(tmp_path: Path, single: bool) -> None:
    """Down/Polling on an adapter the role does not need (its links are all up without it):
    reported as a spare, never a WARN or FAIL, however long it stays down."""
    node = _node(_spare(single))
    res, _ = _run(tmp_path, [(T0, node), (T0 + 3600, node)])
    spare = res[("ib_port", "mlx5_10/1")]
    assert spare.status is Status.OK and dict(spare.evidence)["surplus"] == "true"
    assert "not needed" in spare.summary
    assert [k for k, r in res.items() if r.status is not Status.OK] == []


def test_down_rail_without_a_spare_still_fails_after_down_max(tmp_path: Path) -> None:
    def down(hcas: list[Hca]) -> None:
        hcas[3].ports[1].state, hcas[3].ports[1].phys_state = "1: DOWN", "2: Polling"

    node = _node(down)
    early, _ = _run(tmp_path / "a", [(T0, node), (T0 + 60, node)])
    assert early[("ib_port", "mlx5_5/1")].status is Status.WARN
    late, _ = _run(tmp_path / "b", [(T0, node), (T0 + H100.network.down_max_s + 1, node)])
    assert _fails(late) == [("ib_port", "mlx5_5/1")]


def test_spare_does_not_excuse_a_down_rail_when_the_role_is_short_of_up_links(tmp_path: Path) -> None:
    """Nine compute ports, two down: only seven up, so both down ports are faults (which of
    them is the spare cannot be told)."""
    def two_down(hcas: list[Hca]) -> None:
        _spare(True)(hcas)
        hcas[3].ports[1].state, hcas[3].ports[1].phys_state = "1: DOWN", "2: Polling"

    res, _ = _run(tmp_path, [(T0, _node(two_down))], history=False)
    assert _fails(res) == [("ib_port", "mlx5_10/1"), ("ib_port", "mlx5_5/1")]


@pytest.mark.parametrize("rate, layer", [("200 Gb/sec (4X HDR)", "InfiniBand"), ("400 Gb/sec (4X NDR)", "Ethernet")])
def test_a_ninth_adapter_that_is_up_but_not_rail_shaped_warns(tmp_path: Path, rate: str, layer: str) -> None:
    """An extra single-port card the compute rule also takes (an HDR card for a management
    fabric; a port flipped to Ethernet) while all 8 rails are good: a WARN naming it, no FAIL."""
    def extra(hcas: list[Hca]) -> None:
        hcas.append(Hca("mlx5_10", hca_type="MT4123", pci="0000:bb:00.0", numa=1, netdev="ibpbbs0",
                        ports={1: Port(rate=rate, link_layer=layer)}))

    res, _ = _run(tmp_path, [(T0, _node(extra))], history=False)
    if layer == "Ethernet":  # no rule takes it: unassigned, shown, never judged
        assert res[("ib_port", "mlx5_10/1")].status is Status.OK
    else:
        r = res[("ib_port", "mlx5_10/1")]
        assert r.status is Status.WARN and dict(r.evidence)["surplus"] == "true" and "not needed" in r.summary
    assert _fails(res) == []


def test_a_slow_rail_still_fails_when_the_spare_is_what_is_down(tmp_path: Path) -> None:
    """Nine ports: one rail at 200 and the spare down. Only 7 rails are good: the slow rail
    FAILs (the down spare is still not needed: 8 are up)."""
    def slow_and_spare(hcas: list[Hca]) -> None:
        _spare(True)(hcas)
        hcas[2].ports[1].rate = "200 Gb/sec (4X HDR)"

    res, _ = _run(tmp_path, [(T0, _node(slow_and_spare))], history=False)
    assert _fails(res) == [("ib_port", "mlx5_4/1")]
    assert res[("ib_port", "mlx5_10/1")].status is Status.OK


@pytest.mark.parametrize("state", ["0: NOP", "9: ???", "17: FUTURE"])
def test_a_port_state_outside_the_spec_is_unknown_not_down(tmp_path: Path, state: str) -> None:
    def odd(hcas: list[Hca]) -> None:
        hcas[1].ports[1].state = state

    res, _ = _run(tmp_path, [(T0, _node(odd)), (T0 + 3600, _node(odd))])
    r = res[("ib_port", "mlx5_1/1")]
    assert r.status is Status.UNKNOWN and "not an IBA port state" in r.summary
    assert _fails(res) == []


def test_active_defer_counts_as_active(tmp_path: Path) -> None:
    def defer(hcas: list[Hca]) -> None:
        hcas[1].ports[1].state = "5: ACTIVE_DEFER"

    res, _ = _run(tmp_path, [(T0, _node(defer))], history=False)
    assert res[("ib_port", "mlx5_1/1")].status is Status.OK


# --- counters: saturation, width, resets ------------------------------------------------------


def _counters(**values: int) -> list[Hca]:
    def set_(hcas: list[Hca]) -> None:
        hcas[1].ports[1].counters.update(values)
    return _node(set_)


@pytest.mark.parametrize("value, width", [(65535, 16), (4294967295, 32), (2**64 - 1, 64)])
def test_saturated_error_counter_is_a_warn_with_its_real_width_and_no_rate(tmp_path: Path, value: int, width: int) -> None:
    """port_rcv_errors is 16-bit in the spec; drivers that fill it from a wider firmware counter
    stick at 2^32-1. Read twice, stuck: a WARN naming the width it stuck at, no rate, no FAIL."""
    res, _ = _run(tmp_path, [(T0, _counters(port_rcv_errors=value)), (T0 + 600, _counters(port_rcv_errors=value))])
    r = res[("ib_errors", "mlx5_1/1")]
    assert r.status is Status.WARN and "port_rcv_errors saturated" in r.summary
    ev = dict(r.evidence)
    assert ev["saturated"] == f"port_rcv_errors={value} ({width}-bit)"
    assert "no rate" in ev["meaning"] and "counters" not in ev
    assert _fails(res) == []


def test_wider_counter_above_the_spec_maximum_still_counts(tmp_path: Path) -> None:
    """symbol_error past 65535 but not all ones: a wider counter that still counts, judged by
    its rate (60000/h here, over the profile's limit), not hidden as 'saturated'."""
    res, _ = _run(tmp_path, [(T0, _counters(symbol_error=70000)), (T0 + 600, _counters(symbol_error=80000))])
    r = res[("ib_errors", "mlx5_1/1")]
    assert r.status is Status.WARN and dict(r.evidence)["counters"] == "symbol_error=60000/h"
    assert "saturated" not in dict(r.evidence)


def test_counter_that_goes_back_is_a_reset_not_a_negative_rate(tmp_path: Path) -> None:
    """A driver reload or perfquery -R: symbol_error 5000 -> 3, 64-bit data counters near 2^64
    -> small. No negative or huge rate; only what grew after the reset is judged."""
    steps = [(T0, _counters(symbol_error=5000, port_rcv_data=2**64 - 64, link_downed=200)),
             (T0 + 600, _counters(symbol_error=3, port_rcv_data=10, link_downed=0)),
             (T0 + 1200, _counters(symbol_error=4, port_rcv_data=20, link_downed=0))]
    res, _ = _run(tmp_path, steps)
    r = res[("ib_errors", "mlx5_1/1")]
    assert r.status is Status.OK
    assert dict(r.evidence)["reset"].startswith("link_downed symbol_error: went back")  # said, not judged
    assert res[("ib_flap", "mlx5_1/1")].status is Status.OK  # link_downed back to 0 is no down
    assert [k for k, r in res.items() if r.status is not Status.OK] == []


def test_saturated_link_downed_does_not_count_flaps(tmp_path: Path) -> None:
    steps = [(T0, _counters(link_downed=255)), (T0 + 60, _counters(link_downed=255))]
    res, _ = _run(tmp_path, steps)
    r = res[("ib_flap", "mlx5_1/1")]
    assert r.status is Status.OK and "saturated" in dict(r.evidence)["link_downed"]


def test_link_downed_jumping_past_its_width_is_no_flapping(tmp_path: Path) -> None:
    """link_downed is 8-bit: 3 then 70000 (a glitch, or a driver counting wider) must not be
    69997 downs and a FLAPPING DRAIN; state transitions still count."""
    steps = [(T0, _counters(link_downed=3)), (T0 + 10, _counters(link_downed=70000)),
             (T0 + 20, _counters(link_downed=70001))]
    res, _ = _run(tmp_path, steps)
    r = res[("ib_flap", "mlx5_1/1")]
    assert r.status is Status.OK and "state transitions only" in dict(r.evidence)["link_downed"]


# --- what sysfs may not give -------------------------------------------------------------------


@pytest.mark.parametrize("gone", [("counters",), ("hw_counters",), ("counters", "hw_counters")])
def test_missing_counter_directories_are_no_verdict_and_no_crash(tmp_path: Path, gone: tuple[str, ...]) -> None:
    def drop(root: Path) -> None:
        for d in gone:
            shutil.rmtree(root / "class/infiniband/mlx5_1/ports/1" / d)

    res, errors = _run(tmp_path, [(T0, _node()), (T0 + 60, _node())], mutate=drop)
    assert errors == ()
    assert res[("ib_port", "mlx5_1/1")].status is Status.OK
    assert (("ib_errors", "mlx5_1/1") in res) == ("counters" not in gone)
    assert [k for k, r in res.items() if r.status is not Status.OK] == []


@pytest.mark.parametrize("junk", [b"", b"\n", b"garbage\n", b"\x00\xff\xfe", b"4 ACTIVE\n", b"-1: DOWN\n"])
def test_junk_in_state_rate_and_a_counter_is_unknown_for_that_port(tmp_path: Path, junk: bytes) -> None:
    def spoil(root: Path) -> None:
        port = root / "class/infiniband/mlx5_1/ports/1"
        for f in ("state", "rate", "counters/symbol_error", "hw_counters/packet_seq_err"):
            (port / f).write_bytes(junk)

    res, errors = _run(tmp_path, [(T0, _node())], mutate=spoil)
    r = res[("ib_port", "mlx5_1/1")]
    if junk == b"-1: DOWN\n":  # parses, but -1 is no port state
        assert r.status is Status.UNKNOWN and "not an IBA port state" in r.summary
    else:
        assert r.status is Status.UNKNOWN and "could not be read" in r.summary
    assert any("mlx5_1/ports/1/counters/symbol_error" in e for e in errors)
    assert _fails(res) == [] and res[("ib_port", "role/compute")].status is Status.OK


def _failing_reads(monkeypatch: pytest.MonkeyPatch, name: str, err: int) -> None:
    """Make every read of files called `name` fail with `err`, as sysfs does when the driver's
    show() returns it (EIO from a firmware command, ETIMEDOUT from a stuck MAD)."""
    real = infiniband._Kept.read

    def read(self: infiniband._Kept, dfd: int, fname: str, settled: bool) -> bytes:
        if fname == name:
            raise OSError(err, "injected")
        return real(self, dfd, fname, settled)

    monkeypatch.setattr(infiniband._Kept, "read", read)


@pytest.mark.parametrize("err", [errno.EIO, errno.EINVAL, errno.ENODEV])
def test_a_state_file_that_fails_to_read_is_unknown_for_its_ports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   err: int) -> None:
    _failing_reads(monkeypatch, "state", err)
    res, errors = _run(tmp_path, [(T0, _node())])
    ports = {k: r for k, r in res.items() if k[0] == "ib_port" and not k[1].startswith("role/")}
    assert ports and all(r.status is Status.UNKNOWN for r in ports.values())
    assert _fails(res) == [] and len(errors) == len(ports)


@pytest.mark.parametrize("err", [errno.EIO, errno.EINVAL])
def test_a_counter_that_fails_to_read_is_skipped_not_zero(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, err: int) -> None:
    _failing_reads(monkeypatch, "symbol_error", err)
    res, errors = _run(tmp_path, [(T0, _counters(symbol_error=9)), (T0 + 60, _counters(symbol_error=9))])
    assert any(e.endswith("counters/symbol_error: injected") for e in errors)
    assert [k for k, r in res.items() if r.status is not Status.OK] == []


@pytest.mark.parametrize("err", [errno.EACCES, errno.ETIMEDOUT, errno.EMFILE])
def test_local_read_faults_fail_the_collection_never_a_port(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, err: int) -> None:
    """EACCES (a hardened unit), ETIMEDOUT, EMFILE say this host could not read: the whole
    collection fails (every IB check UNKNOWN, tests/unit/test_ib_port_roles.py), no verdict."""
    _failing_reads(monkeypatch, "rate", err)
    root = write_tree(tmp_path / "sys", _node())
    with pytest.raises(SourceUnreadable, match="rate"):
        InfinibandCollector(root).collect()


# --- link rates ---------------------------------------------------------------------------------


@pytest.mark.parametrize("text, gbps", [
    ("400 Gb/sec (4X NDR)\n", 400), ("200 Gb/sec (4X HDR)\n", 200), ("100 Gb/sec (4X EDR)\n", 100),
    ("2.5 Gb/sec (1X SDR)\n", 2.5), ("800 Gb/sec (4X XDR)\n", 800), ("1600 Gb/sec (8X XDR)\n", 1600),
    ("100 Gb/sec (1X NDR)\n", 100), ("56 Gb/sec (4X FDR)\n", 56), ("10 Gb/sec (4X)\n", 10),
])
def test_rate_text_of_every_generation_parses(text: str, gbps: float) -> None:
    assert parse_rate(text) * 8 / 1e9 == gbps


@pytest.mark.parametrize("rate, status", [
    ("800 Gb/sec (4X XDR)", Status.OK),  # faster than the profile knows: not slower than it wants
    ("1600 Gb/sec (8X XDR)", Status.OK),
    ("200 Gb/sec (4X HDR)", Status.FAIL),  # a rail trained down: real, and the role says fail
    ("100 Gb/sec (1X NDR)", Status.FAIL),  # lanes lost
    ("2.5 Gb/sec (1X SDR)", Status.UNKNOWN),  # also what the kernel prints for a speed it lacks
    ("10 Gb/sec (4X SDR)", Status.UNKNOWN),
    ("0 Gb/sec", Status.UNKNOWN),
])
def test_active_rail_rate_verdicts(tmp_path: Path, rate: str, status: Status) -> None:
    def set_rate(hcas: list[Hca]) -> None:
        hcas[1].ports[1].rate = rate

    res, _ = _run(tmp_path, [(T0, _node(set_rate))], history=False)
    r = res[("ib_port", "mlx5_1/1")]
    assert r.status is status, r
    if status is Status.UNKNOWN and "SDR" in rate:
        assert "does not know" in r.summary and float(dict(r.evidence)["rate_gbps"]) == parse_rate(rate) * 8 / 1e9


def test_a_slow_ethernet_storage_port_is_still_judged(tmp_path: Path) -> None:
    """RoCE ports report their Ethernet speed (10GbE: "10 Gb/sec (1X QDR)"): no SDR fallback
    there, so a storage bond trained at 10 Gb/s is its role's WARN, as before."""
    def slow(hcas: list[Hca]) -> None:
        hcas[-1].ports[1].rate = "10 Gb/sec (1X QDR)"

    res, _ = _run(tmp_path, [(T0, _node(slow))], history=False)
    assert res[("ib_port", "mlx5_bond_0/1")].status is Status.WARN


def test_sdr_rates_are_the_kernel_fallback_and_nothing_else() -> None:
    assert all(is_kernel_fallback_rate(2.5 * w) for w in (1, 2, 4, 8, 12))
    assert not any(is_kernel_fallback_rate(g) for g in (14, 25, 50, 56, 100, 200, 400, 800))


# --- the real saturated capture -----------------------------------------------------------------

# ibqueryerrors' PortCounters names -> the sysfs counters/ files (drivers/infiniband/core/sysfs.c)
_IBQ_TO_SYSFS = {"SymbolErrorCounter": "symbol_error", "LinkErrorRecoveryCounter": "link_error_recovery",
                 "LinkDownedCounter": "link_downed", "PortRcvErrors": "port_rcv_errors",
                 "PortRcvSwitchRelayErrors": "port_rcv_switch_relay_errors", "PortXmitDiscards": "port_xmit_discards",
                 "VL15Dropped": "VL15_dropped", "PortXmitWait": "port_xmit_wait"}


def test_real_saturated_ports_warn_only_for_stuck_error_counters(shared_fixtures: Path, tmp_path: Path) -> None:
    """The linux-rdma 2021 ibqueryerrors capture (mlx4 + SX6036): every port's counters as sysfs
    would hold them, read twice. SymbolErrorCounter == 65535 is a stuck error counter (WARN);
    PortXmitWait == 4294967295 is congestion (evidence only); LinkErrorRecoveryCounter == 15
    is below its 8-bit maximum. No port FAILs, none gets a rate from a stuck counter."""
    import re

    text = (shared_fixtures / "infiniband" /
            "ibqueryerrors_saturated_symbolerror65535_xmitwait_sx6036_linux-rdma_2021.txt").read_text()
    hcas: list[Hca] = []
    for n, line in enumerate(ln for ln in text.splitlines() if re.match(r"\s+GUID \S+ port \d+:", ln)):
        counters = {_IBQ_TO_SYSFS[k]: int(v) for k, v in re.findall(r"\[(\w+) == (\d+)\]", line)}
        hcas.append(Hca(f"mlx4_{n}", hca_type="MT4099", ports={1: Port(rate="56 Gb/sec (4X FDR)", counters=counters)}))
    assert len(hcas) == 14
    generic = profiles.load("generic")
    res, errors = _run(tmp_path, [(T0, hcas), (T0 + 600, hcas)], generic)
    assert errors == () and _fails(res) == []
    warned = {e for (c, e), r in res.items() if c == "ib_errors" and r.status is Status.WARN}
    stuck = {f"mlx4_{n}/1" for n, h in enumerate(hcas) if h.ports[1].counters.get("symbol_error") == 65535}
    assert warned == stuck and len(stuck) == 2
    for e in stuck:
        assert dict(res[("ib_errors", e)].evidence)["saturated"] == "symbol_error=65535 (16-bit)"
    congested = [r for (c, _), r in res.items() if c == "ib_errors" and "saturated_not_errors" in dict(r.evidence)]
    assert len(congested) == 7
    assert all(dict(r.evidence)["saturated_not_errors"] == "port_xmit_wait=4294967295 (32-bit)" for r in congested)
