"""doctor and the plugin say when DRA claims cannot reach any CDI injector: a kubelet >= 1.31
sends them as CRI CDIDevices only, which containerd ignores with its own CDI off."""

from __future__ import annotations

from pathlib import Path

from nri_plugin.nri.versions import CDI_OFF, NativeCdi, RuntimeInfo
from nri_plugin.ops.doctor import ContainerdConfig, check_dra
from nri_plugin.ops.runtime_cdi import start_warning
from nri_plugin.plugins.cdi_injector.delegation import RuntimeCdiConfig

V2_OFF = {"version": 2, "plugins": {"io.containerd.grpc.v1.cri": {"enable_cdi": False}}}
V3_ON = {"version": 3, "plugins": {"io.containerd.cri.v1.runtime": {
    "enable_cdi": True, "cdi_spec_dirs": ["/etc/cdi", "/var/run/cdi"]}}}


def test_cdi_off_is_broken_for_dra_and_says_what_to_change(tmp_path: Path) -> None:
    cfg = ContainerdConfig(path="/etc/containerd/config.toml", data=V2_OFF, major=1)
    check = check_dra(cfg, [str(tmp_path)])
    assert check.status == "warn" and "broken for DRA" in check.detail
    assert '[plugins."io.containerd.grpc.v1.cri"] enable_cdi = true' in check.fix
    assert "cdi_spec_dirs" in check.fix and "\n" not in check.detail + check.fix
    # a DRA driver's claim spec present: DRA is in use, so it fails
    (tmp_path / "k8s.gpu.nvidia.com-claim_1234.yaml").write_text("")
    check = check_dra(cfg, [str(tmp_path)])
    assert check.status == "fail" and "k8s.gpu.nvidia.com-claim_1234.yaml" in check.detail


def test_cdi_on_serves_dra(tmp_path: Path) -> None:
    cfg = ContainerdConfig(path="/x", data=V3_ON, major=2)
    assert check_dra(cfg, ["/etc/cdi", "/var/run/cdi"]).status == "ok"
    # containerd 2.x defaults: CDI on
    assert check_dra(ContainerdConfig(path="/x", data=None, major=2), ["/etc/cdi"]).status == "ok"


def _runtime(version: str, enabled: NativeCdi) -> RuntimeInfo:
    runtime = RuntimeInfo.from_configure("containerd", version)
    return RuntimeCdiConfig(enabled=enabled, spec_dirs=CDI_OFF, origin="test").applied_to(runtime)


def test_the_plugin_warns_at_start_where_claims_reach_nobody() -> None:
    line = start_warning(_runtime("1.7.24", NativeCdi.OFF))
    assert line is not None and "enable_cdi = true" in line and "\n" not in line
    assert start_warning(_runtime("2.1.9", NativeCdi.ON)) is None
    # containerd 2.2 (NRI 0.11) leaves Container.CDI_devices empty: dropped silently too
    line = start_warning(_runtime("2.2.1", NativeCdi.OFF))
    assert line is not None and "start without their devices" in line
    # containerd 2.3 fills it, but refuses CDIDevices with its CDI off before NRI
    line = start_warning(_runtime("2.3.4", NativeCdi.OFF))
    assert line is not None and "fail to be created" in line
    assert start_warning(_runtime("2.3.4", NativeCdi.ON)) is None


DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"


def test_the_dra_snippets_serve_claims() -> None:
    import tomllib

    from nri_plugin.ops.doctor import check_native_cdi, check_nri_enabled

    for name, major in (("containerd-1.7-dra.toml", 1), ("containerd-2.x.toml", 2)):
        cfg = ContainerdConfig(path=name, data=tomllib.loads((DEPLOY / name).read_text()),
                               major=major)
        assert check_dra(cfg, ["/etc/cdi", "/var/run/cdi"]).status == "ok", name
        assert check_nri_enabled(cfg, "/var/run/nri/nri.sock").status == "ok", name
        assert check_native_cdi(cfg, ["/etc/cdi", "/var/run/cdi"]).status == "ok", name
    cfg = ContainerdConfig(path="1.7", major=1, data=tomllib.loads(
        (DEPLOY / "containerd-1.7.toml").read_text()))
    assert check_dra(cfg, ["/etc/cdi"]).status == "warn"  # the device-plugin set-up


def test_the_dra_example_claims_through_a_template() -> None:
    import yaml

    docs = [d for d in yaml.safe_load_all((DEPLOY / "dra-example.yaml").read_text()) if d]
    kinds = {d["kind"]: d for d in docs}
    assert kinds["ResourceClaimTemplate"]["apiVersion"] == "resource.k8s.io/v1"
    pod = kinds["Pod"]["spec"]
    (claim,) = pod["resourceClaims"]
    assert claim["resourceClaimTemplateName"] == kinds["ResourceClaimTemplate"]["metadata"][
        "name"]
    assert pod["containers"][0]["resources"]["claims"] == [{"name": claim["name"]}]
    values = yaml.safe_load((DEPLOY / "dra-driver-values.yaml").read_text())
    (cm,) = [d for d in yaml.safe_load_all((DEPLOY / "configmap.yaml").read_text()) if d]
    config = yaml.safe_load(cm["data"]["config.yaml"])
    assert values["nvidiaDriverRoot"] == config["generate"]["driver_root"]
