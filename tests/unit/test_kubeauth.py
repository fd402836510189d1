"""In-cluster credentials (fencing/kubeauth.py): clear errors outside a pod, a token re-read on change."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from podhealth.fencing.kube import KubeFencer
from podhealth.fencing.kubeauth import InClusterError, TokenFile, in_cluster_configuration

ENV = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}


def _sa(tmp: Path, token: str = "tok-1", ca: str = "-----BEGIN CERTIFICATE-----\n") -> Path:
    d = tmp / "sa"
    d.mkdir(exist_ok=True)
    (d / "token").write_text(token)
    (d / "ca.crt").write_text(ca)
    return d


def test_configuration_from_the_service_account(tmp_path: Path) -> None:
    cfg = in_cluster_configuration(_sa(tmp_path), ENV)
    assert cfg.host == "https://10.96.0.1:443"
    assert cfg.ssl_ca_cert == str(tmp_path / "sa" / "ca.crt")
    assert cfg.auth_settings()["BearerToken"]["value"] == "Bearer tok-1"
    v6 = in_cluster_configuration(_sa(tmp_path), {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"})
    assert v6.host == "https://[fd00::1]:443"


def test_outside_a_pod_the_error_names_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(InClusterError, match="KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT not set"):
        in_cluster_configuration(_sa(tmp_path), {})
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InClusterError, match=f"token {empty}/token does not exist"):
        in_cluster_configuration(empty, ENV)
    (empty / "token").write_text("t")
    with pytest.raises(InClusterError, match=f"CA certificate {empty}/ca.crt does not exist"):
        in_cluster_configuration(empty, ENV)
    (empty / "ca.crt").write_text("")
    with pytest.raises(InClusterError, match="Cert file exists but empty"):
        in_cluster_configuration(empty, ENV)
    with pytest.raises(InClusterError, match="is empty"):
        in_cluster_configuration(_sa(tmp_path, token=""), ENV)


def test_the_fencer_says_in_cluster_and_the_missing_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ValueError, match=f"in-cluster service account: service account token {tmp_path}/token"):
        KubeFencer(in_cluster=True, service_account_dir=str(tmp_path))


def test_token_is_re_read_when_the_file_changes(tmp_path: Path) -> None:
    sa = _sa(tmp_path, token="tok-1")
    cfg = in_cluster_configuration(sa, ENV)
    assert cfg.get_api_key_with_prefix("BearerToken") == "Bearer tok-1"
    tmp = sa / "..2026_token"
    tmp.write_text("tok-2\n")
    os.replace(tmp, sa / "token")  # the kubelet's atomic swap
    assert cfg.get_api_key_with_prefix("BearerToken") == "Bearer tok-2"


def test_a_token_file_gone_mid_rotation_keeps_the_token_held(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("tok-1")
    tf = TokenFile(path)
    path.unlink()
    assert tf.refresh() == "tok-1"
    path.write_text("")  # half-written: not a token
    assert tf.refresh() == "tok-1"
    path.write_text("tok-2")
    assert tf.refresh() == "tok-2"
