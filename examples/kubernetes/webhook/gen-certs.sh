#!/usr/bin/env bash
# Issue the webhook's serving certificate from a private CA, with openssl, and install it.
#
#   ./gen-certs.sh --out DIR      # only write DIR/ca.crt, DIR/tls.crt, DIR/tls.key
#   ./gen-certs.sh --apply        # also, with kubectl:
#       1. create or replace the Secret nri-midbatch-webhook-tls (type kubernetes.io/tls);
#       2. wait until the Deployment nri-midbatch-webhook is rolled out with it;
#       3. apply mutatingwebhookconfiguration.yaml and validatingwebhookconfiguration.yaml
#          from this directory with the CA in every webhook's clientConfig.caBundle.
#
# Step 3 comes last on purpose: the CREATE validation fails closed, so the configurations
# must not point at a webhook that is not serving yet.
#
# Options: --namespace NS (nri-midbatch), --service NAME (nri-midbatch-webhook),
# --secret NAME (nri-midbatch-webhook-tls), --days N (365), --out DIR (a new temporary
# directory). KUBECTL and OPENSSL name the programs to run.
#
# Running it again issues a new CA and certificate. The caBundle then holds the new CA
# and the previous one, so the API server keeps trusting the replicas that still serve the
# old certificate until the kubelet has refreshed the Secret in their pods (about a
# minute; the webhook re-reads the files within 10 s after that). For automatic renewal
# use cert-manager instead: cert-manager/certificate.yaml.
set -euo pipefail

namespace=nri-midbatch
service=nri-midbatch-webhook
secret=nri-midbatch-webhook-tls
deployment=nri-midbatch-webhook
configuration=nri-midbatch-webhook
days=365
out=""
apply=false
kubectl=${KUBECTL:-kubectl}
openssl=${OPENSSL:-openssl}
here=$(CDPATH='' cd -- "$(dirname -- "$0")" && pwd)

usage() {
  echo "usage: $0 [--apply] [--out DIR] [--namespace NS] [--service NAME] [--secret NAME] [--days N]" >&2
  exit 2
}

while [ $# -gt 0 ]; do
  case "$1" in
    --apply) apply=true ;;
    --out) [ $# -ge 2 ] || usage; out=$2; shift ;;
    --namespace) [ $# -ge 2 ] || usage; namespace=$2; shift ;;
    --service) [ $# -ge 2 ] || usage; service=$2; shift ;;
    --secret) [ $# -ge 2 ] || usage; secret=$2; shift ;;
    --days) [ $# -ge 2 ] || usage; days=$2; shift ;;
    -h|--help) usage ;;
    *) echo "unknown argument: $1" >&2; usage ;;
  esac
  shift
done
case "$days" in ''|*[!0-9]*) echo "--days must be a whole number" >&2; exit 2 ;; esac

if [ -z "$out" ]; then
  out=$(mktemp -d)
fi
mkdir -p "$out"
umask 077
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# A P-256 CA that signs nothing but this certificate.
"$openssl" genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$work/ca.key" 2>/dev/null
"$openssl" req -x509 -new -key "$work/ca.key" -sha256 -days "$days" \
  -subj "/CN=$service-ca" \
  -addext "basicConstraints=critical,CA:TRUE,pathlen:0" \
  -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -out "$out/ca.crt"

# The serving certificate: every name the Service answers to inside the cluster.
"$openssl" genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$out/tls.key" 2>/dev/null
"$openssl" req -new -key "$out/tls.key" -subj "/CN=$service.$namespace.svc" -out "$work/tls.csr"
cat > "$work/ext.cnf" <<EXT
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth
subjectAltName=DNS:$service,DNS:$service.$namespace,DNS:$service.$namespace.svc,DNS:$service.$namespace.svc.cluster.local
EXT
"$openssl" x509 -req -in "$work/tls.csr" -CA "$out/ca.crt" -CAkey "$work/ca.key" \
  -set_serial "0x$("$openssl" rand -hex 16)" -sha256 -days "$days" \
  -extfile "$work/ext.cnf" -out "$out/tls.crt" 2>/dev/null
# The CA key is gone with $work: nothing can sign with this CA again.
echo "wrote $out/ca.crt, $out/tls.crt and $out/tls.key" >&2

if ! $apply; then
  exit 0
fi

"$kubectl" -n "$namespace" create secret tls "$secret" \
  --cert="$out/tls.crt" --key="$out/tls.key" --dry-run=client -o yaml \
  | "$kubectl" apply -f -

"$kubectl" -n "$namespace" rollout status "deployment/$deployment" --timeout=180s

# The new CA first, then the previous bundle's first CA (if any), base64 on one line.
previous=$("$kubectl" get mutatingwebhookconfiguration "$configuration" \
  -o 'jsonpath={.webhooks[0].clientConfig.caBundle}' 2>/dev/null || true)
cp "$out/ca.crt" "$work/bundle.pem"
if [ -n "$previous" ]; then
  printf '%s' "$previous" | base64 -d 2>/dev/null \
    | awk '/-----BEGIN CERTIFICATE-----/ {n++} n == 1 {print} /-----END CERTIFICATE-----/ && n == 1 {exit}' \
    >> "$work/bundle.pem" || true
fi
bundle=$(base64 < "$work/bundle.pem" | tr -d '\n')

for file in mutatingwebhookconfiguration.yaml validatingwebhookconfiguration.yaml; do
  awk -v ca="$bundle" '
    { print }
    /^    clientConfig:[[:space:]]*$/ { print "      caBundle: " ca }
  ' "$here/$file" | "$kubectl" apply -f -
done
