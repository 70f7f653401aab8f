#!/usr/bin/env bash
# tests/launch/check_tf_config.sh PROGRAM EXPECTED WORK_DIR: runs PROGRAM as a cluster of 1 chief, 2 ps and
# 2 workers started by hand, each with the TF_CONFIG that Kubeflow's TFJob would write (no pss-launch),
# on 127.0.0.1 ports free at the start; compares the chief's stdout with EXPECTED and requires every task
# to exit 0. Every process started here is waited for, or killed by its pid after 120 s.
# The TLS certificates are made with the openssl tool, as the README shows for Kubernetes, and each task
# gets its own through PSS_TLS_CA, PSS_TLS_CERT and PSS_TLS_KEY (what a mounted secret would give).
set -euo pipefail
program=$1 expected=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
# shellcheck source-path=SCRIPTDIR source=hand_cluster.sh
source "$(dirname "${BASH_SOURCE[0]}")/hand_cluster.sh"
tls=$work/tls && mkdir -m 700 "$tls"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj "/CN=pss test CA" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -keyout "$tls/ca.key" -out "$tls/ca.crt" 2>/dev/null
for task in ps:0 ps:1 worker:0 worker:1 chief:0; do
  type=${task%%:*} index=${task##*:}
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$type-$index" \
    -keyout "$tls/$type-$index.key" -out "$tls/$type-$index.csr" 2>/dev/null
  printf 'subjectAltName=URI:pss:/job:%s/replica:0/task:%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$type" "$index" \
    >"$tls/$type-$index.ext"
  openssl x509 -req -in "$tls/$type-$index.csr" -CA "$tls/ca.crt" -CAkey "$tls/ca.key" -CAcreateserial -days 2 \
    -extfile "$tls/$type-$index.ext" -out "$tls/$type-$index.crt" 2>/dev/null
done
unset PSS_TLS_DIR
pids=()
cleanup() { for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done; }
trap cleanup EXIT
for task in ps:0 ps:1 worker:0 worker:1 chief:0; do
  type=${task%%:*} index=${task##*:}
  TF_CONFIG="{\"cluster\": $cluster, \"task\": {\"type\": \"$type\", \"index\": $index}}" \
  PSS_TLS_CA=$tls/ca.crt PSS_TLS_CERT=$tls/$type-$index.crt PSS_TLS_KEY=$tls/$type-$index.key \
    timeout 120 "$program" >"$work/$type$index.out" 2>"$work/$type$index.err" &
  pids+=($!)
done
status=0
for i in "${!pids[@]}"; do
  if ! wait "${pids[$i]}"; then echo "task $i exited with an error:"; cat "$work"/*.err; status=1; fi
done
pids=()
if ! cmp -s "$expected" "$work/chief0.out"; then
  echo "the chief's output differs from $expected:"; diff "$expected" "$work/chief0.out" || true; exit 1
fi
for f in ps0 ps1 worker0 worker1; do
  if [[ -s "$work/$f.out" ]]; then echo "$f printed to stdout:"; cat "$work/$f.out"; status=1; fi
done
exit $status
