"""Site golden profiles: `extends` a shipped profile, validated with file, line and key, loaded
through `checks.profile_file` wherever the node's profile is used."""

from __future__ import annotations

from pathlib import Path

import pytest

from podhealth import config
from podhealth.checks import profiles
from podhealth.checks.profiles import catalog, site as site_profile

pytestmark = pytest.mark.timeout(60)

SITE = """\
extends: dgx-h100
name: site-a-h100
gpu_model: "NVIDIA H100 80GB HBM3"
nfs_mounts: [/home, /lustre]
thresholds:
  gpu_temp_warn_c: 82.5
versions:
  driver: "550.54.15"
  hca_fw: {MT_0000000838: "28.39.1002"}
drift:
  kernel: FAIL
"""


def write(tmp_path: Path, text: str, name: str = "site.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_extends_keeps_what_the_file_leaves_out(tmp_path: Path) -> None:
    prof = site_profile.load(write(tmp_path, SITE))
    base = profiles.load("dgx-h100")
    assert prof.name == "site-a-h100"
    assert prof.nfs_mounts == ("/home", "/lustre")
    assert prof.thresholds["gpu_temp_warn_c"] == 82.5
    # one key of a section overrides that key only
    assert prof.thresholds["gpu_temp_fail_c"] == base.thresholds["gpu_temp_fail_c"]
    assert prof.versions["driver"] == "550.54.15" and prof.versions["kernel"] == ""
    assert prof.versions["hca_fw"] == {"MT_0000000838": "28.39.1002"}
    assert prof.drift["kernel"] == "FAIL" and prof.drift["driver"] == "WARN"
    assert prof.gpu_count == base.gpu_count and prof.nvlink_links == base.nvlink_links


def test_config_overrides_apply_on_top_of_the_site_file(tmp_path: Path) -> None:
    path = write(tmp_path, SITE)
    cfg = config.loads(f"checks:\n  profile_file: {path}\n  overrides:\n    thresholds: {{gpu_temp_warn_c: 80}}\n"
                       f"    versions.driver: '560.35.03'\n")
    prof = profiles.of_config(cfg)
    assert prof.thresholds["gpu_temp_warn_c"] == 80
    assert prof.versions["driver"] == "560.35.03"
    assert prof.nfs_mounts == ("/home", "/lustre")
    # without a site file, node.profile as before
    assert profiles.of_config(config.Config()).name == "dgx-h100"


@pytest.mark.parametrize("text, where", [
    ("extends: dgx-h999\n", "site.yaml:1: extends: expected one of"),
    ("extends: dgx-h100\ngpu_count: eight\n", "site.yaml:2: gpu_count: expected an integer"),
    ("extends: dgx-h100\nthresholds:\n  gpu_temp_warn: 80\n", "site.yaml:3: thresholds.gpu_temp_warn: unknown key"),
    ("extends: dgx-h100\ndrift:\n  kernel: PANIC\n", "site.yaml:3: drift.kernel: expected one of 'OK', 'WARN', 'FAIL'"),
    ("extends: dgx-h100\nversions:\n  hca_fw: [28.39.1002]\n", "site.yaml:3: versions.hca_fw: expected a mapping"),
    ("extends: dgx-h100\nnfs_mounts: /home\n", "site.yaml:2: nfs_mounts: expected a list"),
    ("extends: dgx-h100\ngpu_cuont: 8\n", "site.yaml:2: gpu_cuont: unknown key"),
    ("extends: dgx-h100\n  bad: [\n", "site.yaml:2: invalid YAML"),
    # the network section is validated by its owner (checks/ib_profile.py); the line is found here
    ("extends: dgx-h100\nnetwork:\n  roles:\n    compute: {count: 8}\n    storage:\n      count: -2\n",
     "site.yaml:6: network.roles.storage.count: expected a whole number >= 0"),
    ("extends: dgx-h100\nnetwork:\n  flap_cuont: 3\n", "site.yaml:3: network.flap_cuont: unknown key"),
])
def test_errors_name_file_line_and_key(tmp_path: Path, text: str, where: str) -> None:
    with pytest.raises(profiles.ProfileError) as e:
        site_profile.load(write(tmp_path, text))
    assert where in str(e.value)


def test_a_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(profiles.ProfileError, match="cannot read"):
        site_profile.load(tmp_path / "absent.yaml")


def test_config_key_must_be_absolute() -> None:
    with pytest.raises(config.ConfigError, match="checks.profile_file: expected an absolute path"):
        config.loads("checks:\n  profile_file: site.yaml\n", "podhealth.yaml")


def test_schema_follows_profiles_yaml() -> None:
    # every key of the shipped defaults can be stated by a site, and nothing else
    fields = {f for f in site_profile.schema().__dataclass_fields__} - {"extends", "name"}
    assert fields == set(catalog._raw()["defaults"])
