#!/usr/bin/env python3
"""tests/engines/check_kubernetes.py: checks a Kubeflow TFJob manifest for pss without a cluster.

Usage: check_kubernetes.py MANIFEST RESOLVE_TASK
  e.g. python3 tests/engines/check_kubernetes.py examples/kubernetes/tfjob.yaml path/to/resolve_task

It checks the manifest's pod templates (each replica's container is named "tensorflow", has the
container port "tfjob-port", and TLS credentials from a Secret mounted at /etc/pss), renders the
TF_CONFIG the training operator gives each replica, runs RESOLVE_TASK (tests/engines/resolve_task.cpp)
with it, and checks that pss::AutoClusterResolver finds that task in that cluster. One line per
replica; exit 0 when all pass, 1 on any mismatch (each one said), 2 for a wrong command line, 77
(skipped) when PyYAML is missing (Debian: python3-yaml).
"""

import json
import os
import subprocess
import sys

PROG = "check_kubernetes.py"

# The training operator's constants (kubeflow.org/v1, pkg/apis/kubeflow.org/v1/tensorflow_types.go).
CONTAINER_NAME = "tensorflow"  # TFJobDefaultContainerName: TF_CONFIG goes to this container only
PORT_NAME = "tfjob-port"       # TFJobDefaultPortName
DEFAULT_PORT = 2222            # TFJobDefaultPort: what the defaulting webhook adds when the port is missing

TLS_DIR = "/etc/pss"
TLS_FILES = {"PSS_TLS_CA": TLS_DIR + "/ca.crt", "PSS_TLS_CERT": TLS_DIR + "/tls.crt", "PSS_TLS_KEY": TLS_DIR + "/tls.key"}

# Variables of the caller's launcher that would make the resolver look elsewhere, or change a task.
FOREIGN_PREFIXES = ("TF_CONFIG", "SLURM_", "OMPI_", "PMI_", "PMIX_", "MPI_", "PSS_")


def fail_usage(message):
    print(f"{PROG}: {message}\nusage: {PROG} MANIFEST RESOLVE_TASK", file=sys.stderr)
    sys.exit(2)


def load_tfjob(path):
    """The one TFJob document of the manifest."""
    try:
        import yaml
    except ImportError:
        print(f"{PROG}: skipped: PyYAML is not installed (Debian: apt-get install python3-yaml)")
        sys.exit(77)
    with open(path, encoding="utf-8") as file:
        documents = [d for d in yaml.safe_load_all(file) if d is not None]
    jobs = [d for d in documents if isinstance(d, dict) and d.get("kind") == "TFJob"]
    if len(jobs) != 1:
        print(f"{PROG}: {path}: expected one TFJob document, found {len(jobs)}", file=sys.stderr)
        sys.exit(1)
    return jobs[0]


def tensorflow_container(template):
    containers = [c for c in template.get("spec", {}).get("containers", []) if c.get("name") == CONTAINER_NAME]
    return containers[0] if len(containers) == 1 else None


def replica_port(spec):
    """GetPortFromTFJob: the containerPort named tfjob-port of the tensorflow container (the defaulting
    webhook adds 2222 under that name when it is missing)."""
    container = tensorflow_container(spec.get("template", {})) or {}
    for port in container.get("ports", []):
        if port.get("name") == PORT_NAME:
            return int(port["containerPort"])
    return DEFAULT_PORT


def render_cluster(job):
    """genClusterSpec: for each replica type, lower-cased, its replicas' Service addresses
    <job>-<type>-<index>.<namespace>.svc:<port> (the operator appends .<CUSTOM_CLUSTER_DOMAIN> when it
    runs with that variable set; not done here). Go's json.Marshal writes a map's keys sorted."""
    name, namespace = job["metadata"]["name"], job["metadata"]["namespace"]
    cluster = {}
    for rtype, spec in job["spec"]["tfReplicaSpecs"].items():
        rt = rtype.lower()
        port = replica_port(spec)
        # GenGeneralName: "/" in the name would become "-"; no valid job name has one.
        cluster[rt] = [f"{name}-{rt}-{i}.{namespace}.svc:{port}".replace("/", "-")
                       for i in range(int(spec.get("replicas", 1)))]
    return dict(sorted(cluster.items()))


def render_tf_config(cluster, rt, index):
    """genTFConfigJSONStr: the TFConfig struct (cluster, task, environment "cloud"), compact as Go writes it."""
    return json.dumps({"cluster": cluster, "task": {"type": rt, "index": index}, "environment": "cloud"},
                      separators=(",", ":"))


def check_manifest(job):
    """The problems of the manifest itself, as messages."""
    problems = []
    if job.get("apiVersion") != "kubeflow.org/v1":
        problems.append(f'apiVersion is {job.get("apiVersion")!r}, not "kubeflow.org/v1"')
    metadata = job.get("metadata", {})
    for field in ("name", "namespace"):
        if not metadata.get(field):
            problems.append(f"metadata.{field} is missing: the TF_CONFIG hosts are <name>-<type>-<index>.<namespace>.svc")
    spec = job.get("spec", {})
    if spec.get("enableDynamicWorker"):
        problems.append('spec.enableDynamicWorker makes the operator write "sparseCluster", which pss does not read')
    replica_specs = spec.get("tfReplicaSpecs") or {}
    shape = {rtype.lower(): int(s.get("replicas", 1)) for rtype, s in replica_specs.items()}
    if shape.get("chief", 0) != 1 or shape.get("ps", 0) < 1 or shape.get("worker", 0) < 1:
        problems.append(f"tfReplicaSpecs has {shape}: pss::ClusterStrategy needs 1 Chief, at least 1 PS and 1 Worker")

    secrets = {}
    for rtype, rspec in replica_specs.items():
        where = f"tfReplicaSpecs.{rtype}"
        if rtype.lower() in ("ps", "worker") and rspec.get("restartPolicy") != "OnFailure":
            problems.append(f"{where}.restartPolicy is {rspec.get('restartPolicy')!r}, not OnFailure: "
                            "a failed task would not come back to rejoin the cluster")
        template = rspec.get("template", {})
        container = tensorflow_container(template)
        if container is None:
            problems.append(f'{where}: no single container named "{CONTAINER_NAME}" (the operator sets TF_CONFIG only there)')
            continue
        if not any(p.get("name") == PORT_NAME for p in container.get("ports", [])):
            problems.append(f'{where}: the container has no port named "{PORT_NAME}" (the TF_CONFIG port)')
        env = {e.get("name"): e.get("value") for e in container.get("env", [])}
        if env.get("PSS_TLS") == "off":
            problems.append(f"{where}: PSS_TLS=off: links would be plaintext")
        triple = {k: env.get(k) for k in TLS_FILES}
        if env.get("PSS_TLS_DIR") != TLS_DIR and triple != TLS_FILES:
            problems.append(f"{where}: TLS credentials not from {TLS_DIR}: set PSS_TLS_DIR={TLS_DIR}, "
                            f"or {', '.join(f'{k}={v}' for k, v in TLS_FILES.items())}")
        mounts = [m for m in container.get("volumeMounts", []) if m.get("mountPath") == TLS_DIR]
        volumes = {v.get("name"): v for v in template.get("spec", {}).get("volumes", [])}
        secret = volumes.get(mounts[0].get("name"), {}).get("secret") if mounts else None
        if not secret or not secret.get("secretName"):
            problems.append(f"{where}: no Secret volume mounted at {TLS_DIR}")
        else:
            secrets[rtype] = secret["secretName"]
            if not mounts[0].get("readOnly"):
                problems.append(f"{where}: the TLS mount at {TLS_DIR} is not readOnly")
    # Each role's keys in its own pods only: a pod holding the chief's key could act as the chief.
    owners = {}
    for rtype, name in secrets.items():
        owners.setdefault(name, []).append(rtype)
    for name, rtypes in owners.items():
        if len(rtypes) > 1:
            problems.append(f"Secret {name} is mounted by {', '.join(rtypes)}: give each replica type its own")
    return problems


def task_environment(container, tf_config):
    """The pod's environment as the resolver would see it: ours without any launcher's variables, plus
    the container's literal env and the operator's TF_CONFIG."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(FOREIGN_PREFIXES)}
    env.update({e["name"]: str(e["value"]) for e in container.get("env", []) if "value" in e})
    env["TF_CONFIG"] = tf_config
    return env


def check_replica(resolve_task, container, cluster, rt, index):
    """None when RESOLVE_TASK finds this replica's task in the rendered cluster, else what differs."""
    tf_config = render_tf_config(cluster, rt, index)
    try:
        run = subprocess.run([resolve_task], env=task_environment(container, tf_config), capture_output=True,
                             text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"{resolve_task} did not run: {error}"
    if run.returncode != 0:
        return f"{resolve_task} exited {run.returncode} with TF_CONFIG={tf_config}: {run.stderr.strip()}"
    lines = dict(line.partition(" ")[::2] for line in run.stdout.splitlines())
    expected = {"source": "tf_config", "task": f"{rt} {index}", "rpc_layer": ""}  # Kubeflow writes no rpc_layer
    problems = [f"{key} is {lines.get(key)!r}, not {value!r}" for key, value in expected.items() if lines.get(key) != value]
    try:
        resolved = json.loads(lines.get("cluster", ""))
    except json.JSONDecodeError:
        resolved = lines.get("cluster")
    if resolved != cluster:
        problems.append(f"the cluster is {json.dumps(resolved)}, not {json.dumps(cluster)}")
    return f"with TF_CONFIG={tf_config}: {'; '.join(problems)}" if problems else None


def main(argv):
    if len(argv) != 3:
        fail_usage("expected 2 arguments")
    manifest, resolve_task = argv[1], argv[2]
    if not os.path.isfile(manifest):
        fail_usage(f"no manifest {manifest}")
    if not (os.path.isfile(resolve_task) and os.access(resolve_task, os.X_OK)):
        print(f"{PROG}: {resolve_task} is not an executable file (build tests/engines/resolve_task.cpp)", file=sys.stderr)
        return 1

    job = load_tfjob(manifest)
    problems = check_manifest(job)
    if problems:
        for problem in problems:
            print(f"{PROG}: {manifest}: {problem}", file=sys.stderr)
        return 1
    metadata = job["metadata"]
    print(f"{PROG}: TFJob {metadata['namespace']}/{metadata['name']}: every replica's container is "
          f"{CONTAINER_NAME} with port {PORT_NAME} and TLS from its type's Secret at {TLS_DIR}: ok")

    cluster = render_cluster(job)
    shape = ", ".join(f"{rt} {len(addresses)}" for rt, addresses in cluster.items())
    failed = 0
    for rtype, spec in job["spec"]["tfReplicaSpecs"].items():
        rt = rtype.lower()
        container = tensorflow_container(spec["template"])
        for index, address in enumerate(cluster[rt]):
            problem = check_replica(resolve_task, container, cluster, rt, index)
            if problem:
                failed += 1
                print(f"{PROG}: {rt} {index} at {address}: FAILED {problem}", file=sys.stderr)
            else:
                print(f"{PROG}: {rt} {index} resolves /job:{rt}/replica:0/task:{index} of {shape} at {address}: ok")
    if failed:
        print(f"{PROG}: {failed} replica(s) of {manifest} failed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
