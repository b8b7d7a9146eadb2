"""examples/kubernetes/webhook: strict schema validation (kubernetes-validate), the properties
the webhook relies on, and the certificate script run for real (openssl) with a stand-in
kubectl."""

from __future__ import annotations

import base64
import os
import shutil
import socket
import ssl
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID

from nri_midbatch.config.model import Config
from nri_midbatch.tools.cli import command_line
from nri_midbatch.tools.webhook.server import _ENDPOINTS, WebhookServer

pytestmark = pytest.mark.packaging

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "examples" / "kubernetes"
WEBHOOK = K8S / "webhook"
CERT_MANAGER = WEBHOOK / "cert-manager"
SCRIPT = WEBHOOK / "gen-certs.sh"
KUBERNETES_VERSION = "1.37.0"
NAMESPACE = "nri-midbatch"
SERVICE_DNS = "nri-midbatch-webhook.nri-midbatch.svc"


def docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def manifests() -> list[Path]:
    return sorted(p for p in WEBHOOK.glob("*.yaml"))


def one(kind: str, directory: Path = WEBHOOK) -> dict[str, Any]:
    found = [d for p in sorted(directory.glob("*.yaml")) for d in docs(p) if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def deployment_container() -> dict[str, Any]:
    containers = one("Deployment")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]  # type: ignore[no-any-return]


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


# ------------------------------------------------------------------------------- schemas


def test_the_expected_manifests_are_there() -> None:
    kinds = sorted(d["kind"] for p in manifests() for d in docs(p))
    assert kinds == [
        "Deployment",
        "MutatingWebhookConfiguration",
        "PodDisruptionBudget",
        "Service",
        "ServiceAccount",
        "ValidatingWebhookConfiguration",
    ]


@pytest.mark.parametrize("path", manifests(), ids=lambda p: p.name)
def test_manifest_validates_strictly(path: Path) -> None:
    import kubernetes_validate

    for document in docs(path):
        validated = kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
        assert validated == "1.37", validated


def test_strict_validation_catches_a_misspelt_field() -> None:
    import kubernetes_validate

    configuration = one("ValidatingWebhookConfiguration")
    configuration["webhooks"][0]["timeoutSecond"] = 5
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(configuration, KUBERNETES_VERSION, strict=True)


def test_cert_manager_objects_are_not_core_kinds() -> None:
    # kubernetes-validate has no cert-manager schemas: these are checked by their contents.
    import kubernetes_validate

    documents = docs(CERT_MANAGER / "certificate.yaml")
    assert [d["kind"] for d in documents] == ["Issuer", "Certificate", "Issuer", "Certificate"]
    for document in documents:
        assert document["apiVersion"] == "cert-manager.io/v1"
        assert document["metadata"]["namespace"] == NAMESPACE
        with pytest.raises(kubernetes_validate.SchemaNotFoundError):
            kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


# ------------------------------------------------------------------------------ deployment


def test_everything_lives_in_the_plugins_namespace() -> None:
    namespace = one("Namespace", K8S)["metadata"]["name"]
    assert namespace == NAMESPACE
    for path in manifests():
        for document in docs(path):
            if document["kind"].endswith("WebhookConfiguration"):
                assert "namespace" not in document["metadata"]  # cluster-scoped
            else:
                assert document["metadata"]["namespace"] == namespace, document["kind"]


def test_deployment_runs_two_spread_replicas_and_keeps_them_up() -> None:
    deployment = one("Deployment")
    spec = deployment["spec"]
    assert spec["replicas"] == 2
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    labels = spec["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= labels.items()
    pdb = one("PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    spread = spec["template"]["spec"]["topologySpreadConstraints"]
    assert spread[0]["topologyKey"] == "kubernetes.io/hostname"
    # Not selected by the plugin's DaemonSet, and not selecting its pods.
    daemonset = one("DaemonSet", K8S)
    assert not daemonset["spec"]["selector"]["matchLabels"].items() <= labels.items()
    plugin_labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert not spec["selector"]["matchLabels"].items() <= plugin_labels.items()


def test_deployment_is_least_privileged() -> None:
    pod_spec = one("Deployment")["spec"]["template"]["spec"]
    assert pod_spec["automountServiceAccountToken"] is False
    account = one("ServiceAccount")
    assert pod_spec["serviceAccountName"] == account["metadata"]["name"]
    assert account["automountServiceAccountToken"] is False
    assert not any(pod_spec.get(k) for k in ("hostNetwork", "hostPID", "hostIPC"))
    assert all("hostPath" not in volume for volume in pod_spec["volumes"])
    pod_security = pod_spec["securityContext"]
    assert pod_security["runAsNonRoot"] is True
    assert pod_security["runAsUser"] > 0
    assert pod_security["seccompProfile"] == {"type": "RuntimeDefault"}
    security = deployment_container()["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["privileged"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert "add" not in security["capabilities"]
    # No RBAC at all: the webhook never calls the API server.
    kinds = {d["kind"] for p in manifests() for d in docs(p)}
    assert not kinds & {"Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}


def test_deployment_args_are_a_webhook_command_line() -> None:
    container = deployment_container()
    args = command_line().parse_args(container["args"])
    assert args.command == "webhook"
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in one("Deployment")["spec"]["template"]["spec"]["volumes"]}
    # TLS from the Secret the script and cert-manager write.
    tls = volumes["tls"]["secret"]
    assert Path(args.tls_cert) == Path(mounts["tls"]) / "tls.crt"
    assert Path(args.tls_key) == Path(mounts["tls"]) / "tls.key"
    assert {i["key"] for i in tls["items"]} == {"tls.crt", "tls.key"}
    # The plugin's own ConfigMap: one configuration for both.
    configmap = one("ConfigMap", K8S)
    assert volumes["config"]["configMap"]["name"] == configmap["metadata"]["name"]
    assert Path(args.config) == Path(mounts["config"]) / "config.yaml"
    assert "config.yaml" in configmap["data"]
    assert all("subPath" not in m for m in container["volumeMounts"])  # updates reach the file
    # Listening on the container port the Service targets, in HTTPS probes too.
    port = next(p for p in container["ports"] if p["name"] == "https")
    assert args.address == f"0.0.0.0:{port['containerPort']}"
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = container[probe]["httpGet"]
        assert (get["scheme"], get["path"], get["port"]) == ("HTTPS", path, "https")
    # The drain delay fits in the grace period.
    grace = one("Deployment")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert args.shutdown_delay + 5 < grace


def test_tls_secret_name_is_shared_by_script_and_cert_manager() -> None:
    volumes = one("Deployment")["spec"]["template"]["spec"]["volumes"]
    secret = next(v["secret"]["secretName"] for v in volumes if v["name"] == "tls")
    assert "secret=" + secret in SCRIPT.read_text()
    certificates = [
        d for d in docs(CERT_MANAGER / "certificate.yaml") if d["kind"] == "Certificate"
    ]
    serving = next(c for c in certificates if not c["spec"].get("isCA"))
    assert serving["spec"]["secretName"] == secret
    service = one("Service")["metadata"]["name"]
    assert serving["spec"]["dnsNames"] == [
        service,
        f"{service}.{NAMESPACE}",
        f"{service}.{NAMESPACE}.svc",
        f"{service}.{NAMESPACE}.svc.cluster.local",
    ]
    assert "server auth" in serving["spec"]["usages"]
    # The CA injector finds this Certificate through both configurations' annotation.
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        annotation = one(kind)["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
        assert annotation == f"{NAMESPACE}/{serving['metadata']['name']}"


# ------------------------------------------------------------------ webhook configurations


def webhooks() -> list[tuple[str, dict[str, Any]]]:
    return [
        (kind, webhook)
        for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
        for webhook in one(kind)["webhooks"]
    ]


def test_every_webhook_has_the_common_settings() -> None:
    service = one("Service")
    service_port = service["spec"]["ports"][0]
    assert service_port["targetPort"] == "https"
    assert service["spec"]["selector"].items() <= (
        one("Deployment")["spec"]["template"]["metadata"]["labels"].items()
    )
    for _, webhook in webhooks():
        assert webhook["admissionReviewVersions"] == ["v1"]
        assert webhook["sideEffects"] == "None"
        assert webhook["timeoutSeconds"] == 5
        assert webhook["namespaceSelector"] == {
            "matchExpressions": [
                {
                    "key": "kubernetes.io/metadata.name",
                    "operator": "NotIn",
                    "values": ["kube-system", NAMESPACE],
                }
            ]
        }
        (rule,) = webhook["rules"]
        assert (rule["apiGroups"], rule["apiVersions"], rule["resources"]) == (
            [""],
            ["v1"],
            ["pods"],
        )
        target = webhook["clientConfig"]["service"]
        assert target["name"] == service["metadata"]["name"]
        assert target["namespace"] == service["metadata"]["namespace"]
        assert target["port"] == service_port["port"]
        assert target["path"] in _ENDPOINTS
        assert "caBundle" not in webhook["clientConfig"]  # filled in at install time


def test_failure_policies_and_operations() -> None:
    summary = {
        webhook["name"]: (
            kind,
            webhook["clientConfig"]["service"]["path"],
            webhook["rules"][0]["operations"],
            webhook["failurePolicy"],
        )
        for kind, webhook in webhooks()
    }
    assert summary == {
        "mutate-pods.nri-midbatch.io": (
            "MutatingWebhookConfiguration",
            "/mutate",
            ["CREATE"],
            "Ignore",
        ),
        "validate-pod-create.nri-midbatch.io": (
            "ValidatingWebhookConfiguration",
            "/validate",
            ["CREATE"],
            "Fail",
        ),
        "validate-pod-update.nri-midbatch.io": (
            "ValidatingWebhookConfiguration",
            "/validate",
            ["UPDATE"],
            "Ignore",
        ),
    }
    mutating = one("MutatingWebhookConfiguration")["webhooks"][0]
    assert mutating["reinvocationPolicy"] == "IfNeeded"


# ---------------------------------------------------------------------------- gen-certs.sh


def test_script_parses_and_is_executable() -> None:
    assert os.access(SCRIPT, os.X_OK)
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


@pytest.fixture
def openssl() -> str:
    found = shutil.which("openssl")
    if found is None:
        pytest.skip("gen-certs.sh needs the openssl command line tool")
    return found


def run_script(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
        check=False,
    )


def test_script_issues_a_certificate_for_the_service(openssl: str, tmp_path: Path) -> None:
    result = run_script("--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    ca = x509.load_pem_x509_certificate((tmp_path / "ca.crt").read_bytes())
    cert = x509.load_pem_x509_certificate((tmp_path / "tls.crt").read_bytes())
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == [
        "nri-midbatch-webhook",
        "nri-midbatch-webhook.nri-midbatch",
        SERVICE_DNS,
        SERVICE_DNS + ".cluster.local",
    ]
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert (tmp_path / "tls.key").stat().st_mode & 0o077 == 0
    assert not (tmp_path / "ca.key").exists()  # the CA key never leaves the script
    # The webhook serves with it, and a client that trusts only ca.crt and checks the
    # service name (as the API server does) accepts it.
    webhook = WebhookServer(
        "127.0.0.1:0", tmp_path / "tls.crt", tmp_path / "tls.key", Config(), reload_interval=3600
    )
    webhook.start()
    try:
        context = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
        with (
            socket.create_connection(("127.0.0.1", webhook.port), timeout=5) as raw,
            context.wrap_socket(raw, server_hostname=SERVICE_DNS) as sock,
        ):
            assert sock.version() in ("TLSv1.2", "TLSv1.3")
    finally:
        webhook.stop()


FAKE_KUBECTL = """#!/usr/bin/env bash
echo "$*" >> "$FAKE_DIR/calls"
case "$*" in
  *"create secret tls"*) printf 'kind: Secret\\nargs: "%s"\\n' "$*" ;;
  "apply -f -")
    n=$(ls "$FAKE_DIR" | grep -c '^applied-' || true)
    cat > "$FAKE_DIR/applied-$n.yaml" ;;
  *"rollout status"*) ;;
  *"get mutatingwebhookconfiguration"*) cat "$FAKE_DIR/previous" 2>/dev/null || true ;;
  *) echo "unexpected: $*" >&2; exit 1 ;;
esac
"""


def test_script_applies_secret_then_configurations_with_the_ca(
    openssl: str, tmp_path: Path
) -> None:
    fake = tmp_path / "fake"
    fake.mkdir()
    kubectl = tmp_path / "kubectl"
    kubectl.write_text(FAKE_KUBECTL)
    kubectl.chmod(0o755)
    env = {"KUBECTL": str(kubectl), "FAKE_DIR": str(fake)}
    out = tmp_path / "certs"
    result = run_script("--apply", "--out", str(out), env=env)
    assert result.returncode == 0, result.stderr
    calls = (fake / "calls").read_text().splitlines()
    # The first two run as one pipeline, in either order.
    assert sorted(calls[:2]) == [
        f"-n nri-midbatch create secret tls nri-midbatch-webhook-tls --cert={out}/tls.crt "
        f"--key={out}/tls.key --dry-run=client -o yaml",
        "apply -f -",
    ]
    assert calls[2:] == [
        "-n nri-midbatch rollout status deployment/nri-midbatch-webhook --timeout=180s",
        "get mutatingwebhookconfiguration nri-midbatch-webhook "
        "-o jsonpath={.webhooks[0].clientConfig.caBundle}",
        "apply -f -",
        "apply -f -",
    ]
    assert docs(fake / "applied-0.yaml")[0]["kind"] == "Secret"
    ca_pem = (out / "ca.crt").read_bytes()
    applied = [docs(fake / f"applied-{n}.yaml")[0] for n in (1, 2)]
    assert [d["kind"] for d in applied] == [
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    ]
    for document in applied:
        original = one(document["kind"])
        for webhook, unchanged in zip(document["webhooks"], original["webhooks"], strict=True):
            assert base64.b64decode(webhook["clientConfig"].pop("caBundle")) == ca_pem
            assert webhook == unchanged

    # Issued again: the bundle carries the new CA and the previous one.
    (fake / "previous").write_text(base64.b64encode(ca_pem).decode())
    for leftover in fake.glob("applied-*"):
        leftover.unlink()
    result = run_script("--apply", "--out", str(out), env=env)
    assert result.returncode == 0, result.stderr
    new_ca = (out / "ca.crt").read_bytes()
    assert new_ca != ca_pem
    bundle = docs(fake / "applied-1.yaml")[0]["webhooks"][0]["clientConfig"]["caBundle"]
    trusted = x509.load_pem_x509_certificates(base64.b64decode(bundle))
    assert [c.public_bytes(serialization.Encoding.PEM) for c in trusted] == [new_ca, ca_pem]


def test_script_rejects_unknown_arguments() -> None:
    result = run_script("--days", "soon")
    assert result.returncode == 2
    assert "--days must be a whole number" in result.stderr
    result = run_script("--frobnicate")
    assert result.returncode == 2
    assert "unknown argument: --frobnicate" in result.stderr
