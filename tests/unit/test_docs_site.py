"""docs/site.md's examples are real: every YAML block on the page is marked as a config or a site
profile and loads with podhealth's one validator, and the page's claims about refusals hold."""

from __future__ import annotations

import re

import pytest

from podhealth import config
from podhealth.checks.profiles import site as site_profile
from podhealth.configload import load_text
from tests.conftest import REPO

DOC = REPO / "docs" / "site.md"
BLOCK = re.compile(r"(?:<!-- (?P<kind>[a-z-]+) -->\n)?```yaml\n(?P<body>.*?)```", re.S)


def blocks() -> list[tuple[str, str, int]]:
    text = DOC.read_text(encoding="utf-8")
    return [(m.group("kind") or "", m.group("body"), text.count("\n", 0, m.start("body")) + 1)
            for m in BLOCK.finditer(text)]


def test_every_yaml_block_is_marked() -> None:
    found = blocks()
    assert len(found) >= 4
    unmarked = [line for kind, _, line in found if kind not in ("config", "site-profile")]
    assert not unmarked, f"docs/site.md: yaml blocks without <!-- config --> or <!-- site-profile --> at lines {unmarked}"


@pytest.mark.parametrize("kind, body, line", blocks(), ids=[f"line{b[2]}" for b in blocks()])
def test_yaml_block_loads(kind: str, body: str, line: int) -> None:
    where = f"docs/site.md (block at line {line})"
    if kind == "config":
        cfg = config.loads(body, where)
        if cfg.checks.site:
            assert all(sc.argv[0].startswith("/") for sc in cfg.checks.site.values())
    else:
        sp = site_profile.parse(load_text(site_profile.schema(), body, where))
        assert sp.extends in config.PROFILES


def test_the_documented_examples_exist_and_are_executable() -> None:
    text = DOC.read_text(encoding="utf-8")
    for name in re.findall(r"/usr/local/libexec/podhealth/([a-z-]+)", text):
        p = REPO / "examples" / "checks" / name
        assert p.is_file() and p.stat().st_mode & 0o111, p


def test_a_policy_block_with_a_typo_is_refused_with_its_line() -> None:
    from podhealth import configload
    [_, body, _] = next(b for b in blocks() if "policy:" in b[1])
    broken = body.replace("79: {action: REPLACE}", "79: {action: RMA}")
    [err] = configload.check_text(config.Config, broken, "site.yaml")
    line = broken.splitlines().index(next(x for x in broken.splitlines() if "RMA" in x)) + 1
    assert str(err).startswith(f"site.yaml:{line}: checks.policy.xid.79.action: expected one of")
