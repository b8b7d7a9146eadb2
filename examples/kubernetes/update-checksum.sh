#!/bin/sh
# Recompute the DaemonSet's `checksum/config` pod annotation from configmap.yaml.
#
#   examples/kubernetes/update-checksum.sh          # rewrite daemonset.yaml in place
#   examples/kubernetes/update-checksum.sh --check  # exit 1 if the annotation is stale
#
# The checksum is the SHA-256 of the ConfigMap's `data` as canonical JSON (keys sorted,
# no spaces, UTF-8):
#   json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
# Only `data` counts: comments and labels in configmap.yaml can change without rolling
# the pods. A changed annotation changes the pod template, so `kubectl apply` rolls the
# DaemonSet and every plugin restarts with the new configuration.
#
# Needs python3 with PyYAML (or PYTHON=/path/to/python).
set -eu

dir=$(CDPATH='' cd -- "$(dirname -- "$0")" && pwd)
mode="write"
case "${1:-}" in
  "") ;;
  --check) mode="check" ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

exec "${PYTHON:-python3}" - "$dir/configmap.yaml" "$dir/daemonset.yaml" "$mode" <<'EOF'
import hashlib
import json
import re
import sys

import yaml

configmap_path, daemonset_path, mode = sys.argv[1:4]
with open(configmap_path, encoding="utf-8") as f:
    data = yaml.safe_load(f)["data"]
canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
digest = hashlib.sha256(canonical.encode("utf-8")).hexdigest()

with open(daemonset_path, encoding="utf-8") as f:
    text = f.read()
line = re.compile(r'^(\s*checksum/config:\s*)"?([0-9a-f]*)"?\s*$', re.MULTILINE)
found = line.findall(text)
if len(found) != 1:
    sys.exit(f"{daemonset_path}: expected one checksum/config annotation, found {len(found)}")
current = found[0][1]

if mode == "check":
    if current != digest:
        sys.exit(f"{daemonset_path}: checksum/config is {current or '(empty)'}, want {digest}")
    print(f"checksum/config is up to date: {digest}")
elif current == digest:
    print(f"checksum/config already {digest}")
else:
    with open(daemonset_path, "w", encoding="utf-8") as f:
        f.write(line.sub(lambda m: f'{m.group(1)}"{digest}"', text))
    print(f"checksum/config: {current or '(empty)'} -> {digest}")
EOF
