"""k8s/raycluster.yaml against KubeRay's own RayCluster schema (v1.7.0, vendored in
tests/cluster/kuberay/), as strictly as the API server takes it: a field the schema does not
know is an error, as with kubectl's default strict field validation."""

import copy
import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SCHEMA = Path(__file__).with_name("kuberay") / "raycluster-v1.schema.json"


def strict(node):
    """Unknown fields rejected wherever the schema lists the fields and keeps no unknown ones
    (x-kubernetes-preserve-unknown-fields), as the API server does."""
    if isinstance(node, dict):
        node = {k: strict(v) for k, v in node.items()}
        if "properties" in node and "additionalProperties" not in node and not node.get("x-kubernetes-preserve-unknown-fields"):
            node["additionalProperties"] = False
        return node
    if isinstance(node, list):
        return [strict(v) for v in node]
    return node


@pytest.fixture(scope="module")
def validator():
    schema = json.loads(SCHEMA.read_text())
    assert "KubeRay v1.7.0" in schema["$comment"] and "Apache License 2.0" in schema["$comment"]
    return jsonschema.Draft7Validator(strict(schema))


@pytest.fixture(scope="module")
def manifest():
    documents = list(yaml.safe_load_all((REPO / "k8s" / "raycluster.yaml").read_text()))
    clusters = [d for d in documents if d["kind"] == "RayCluster"]
    assert len(clusters) == 1 and clusters[0]["apiVersion"] == "ray.io/v1"
    return documents


def ray_cluster(documents):
    return copy.deepcopy(next(d for d in documents if d["kind"] == "RayCluster"))


def errors(validator, document) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)]


def test_the_manifest_validates_against_kuberays_schema(validator, manifest):
    assert errors(validator, ray_cluster(manifest)) == []


@pytest.mark.parametrize("mutate", [
    lambda c: c["spec"]["workerGroupSpecs"][0].update(minReplica=0),                        # a typo'd field
    lambda c: c["spec"]["workerGroupSpecs"][0].pop("groupName"),                            # a required one missing
    lambda c: c["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0].update(env="ORCHESTRATE_CACHE_DIR=/x"),
    lambda c: c["spec"]["autoscalerOptions"].update(upscalingMode="Fast"),                  # not one of its values
])
def test_a_broken_manifest_is_rejected(validator, manifest, mutate):
    cluster = ray_cluster(manifest)
    mutate(cluster)
    assert errors(validator, cluster)


def test_gpu_workers_autoscale_from_zero_with_the_shared_volume_and_the_nodes_environment(manifest):
    cluster = ray_cluster(manifest)
    assert cluster["spec"]["enableInTreeAutoscaling"] is True
    (workers,) = cluster["spec"]["workerGroupSpecs"]
    assert workers["minReplicas"] == 0 and workers["replicas"] == 0 and workers["maxReplicas"] == 8
    worker = workers["template"]["spec"]["containers"][0]
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == "1" and workers["rayStartParams"]["num-cpus"] == "4"
    head = cluster["spec"]["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"
    claim = next(d for d in manifest if d["kind"] == "PersistentVolumeClaim")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    # the variables cluster/node-setup.sh writes on every node, with the same values, in every Ray container
    written = dict(re.findall(r"\b([A-Z_]+)=\$shared(/[\w/-]*)?", (REPO / "cluster" / "node-setup.sh").read_text()))
    expected = {name: "/mnt/shared" + (suffix or "") for name, suffix in written.items()}
    assert {"ORCHESTRATE_CACHE_DIR", "HF_HOME", "IR_DATASETS_HOME", "ANSERINI_INDEX_CACHE", "ORCHESTRATE_DATA_DIR"} <= set(expected)
    for group in (head, workers):
        spec = group["template"]["spec"]
        assert any(v.get("persistentVolumeClaim", {}).get("claimName") == claim["metadata"]["name"] for v in spec["volumes"])
        for container in spec["containers"]:
            assert {"name": "shared", "mountPath": "/mnt/shared"} in container["volumeMounts"]
        ray_container = spec["containers"][0]
        # and the auth mode, alike everywhere (test_ray_address: head, workers and driver)
        assert {e["name"]: e["value"] for e in ray_container["env"]} == expected | {"RAY_AUTH_MODE": "disabled"}
    mlflow = next(c for c in head["template"]["spec"]["containers"] if c["name"] == "mlflow")
    assert mlflow["command"][-1].endswith("cluster/mlflow-server.sh") and "readinessProbe" in mlflow


# ---- sizes: every pod fits the node type it names ----------------------------------------------
# The node types docs/cluster.md names: (vCPUs, memory GiB, the most pods EKS's VPC CNI lets the
# node run: its ENIs x (IPv4 addresses per ENI - 1) + 2, 58 and 234 in EKS's eni-max-pods table).
NODE_TYPES = {"g5.xlarge": (4, 16, 58), "m6i.4xlarge": (16, 64, 234)}
# What the node runs beside our pods: kube-proxy's (100m) and the VPC CNI's aws-node (25m) CPU
# requests on EKS, and room for a storage driver's node pod. An allowance, not a measurement.
DAEMONSETS = (250, 256)   # millicores, MiB
# KubeRay's autoscaler sidecar when autoscalerOptions.resources is unset: 500m / 512Mi, requests
# and limits (BuildAutoscalerContainer in ray-operator/controllers/ray/common/pod.go).
AUTOSCALER_DEFAULT = {"cpu": "500m", "memory": "512Mi"}


def eks_allocatable(vcpus: int, memory_gib: int, max_pods: int) -> tuple[int, int]:
    """(millicores, MiB) the kubelet offers pods on an EKS node, as the EKS AMI's bootstrap
    reserves them for the kubelet and the runtime: CPU 6% of the first core, 1% of the second,
    0.5% each of the third and fourth, 0.25% of every core above; memory 255 MiB plus 11 MiB per
    pod the node may run, and 100 MiB kept free for the kubelet's hard eviction. The kernel and
    firmware keep part of the memory, so the kubelet's capacity is below the nominal size: 5% is
    taken off for that (an allowance; EKS reports about 15.2 GiB on a 16 GiB g5.xlarge)."""
    cores = [60, 10, 5, 5] + [2.5] * max(0, vcpus - 4)
    reserved_cpu = sum(cores[:vcpus])
    capacity_mib = memory_gib * 1024 * 95 // 100
    return int(vcpus * 1000 - reserved_cpu), capacity_mib - (255 + 11 * max_pods) - 100


def test_eks_allocatable_by_hand():
    assert eks_allocatable(4, 16, 58) == (3920, 15564 - 893 - 100)      # g5.xlarge: 3.92 CPU, the number
    assert eks_allocatable(16, 64, 234) == (15890, 62259 - 2829 - 100)  # m6i.4xlarge


def quantity(value: str) -> float:
    """A Kubernetes quantity ("3500m", "13Gi") as a number, by Ray's own parser of them."""
    from ray.autoscaler._private.kuberay.utils import parse_quantity
    return float(parse_quantity(value))


def pods(cluster) -> dict[str, tuple[dict, list[dict]]]:
    """Each pod template by group name: (its pod spec, the requests of all its containers, the
    autoscaler sidecar KubeRay injects into the head pod included)."""
    spec = cluster["spec"]
    sidecar = spec.get("autoscalerOptions", {}).get("resources", {}).get("requests", AUTOSCALER_DEFAULT)
    head = spec["headGroupSpec"]["template"]["spec"]
    result = {"head": (head, [c["resources"]["requests"] for c in head["containers"]]
                       + ([sidecar] if spec.get("enableInTreeAutoscaling") else []))}
    for group in spec["workerGroupSpecs"]:
        pod = group["template"]["spec"]
        result[group["groupName"]] = (pod, [c["resources"]["requests"] for c in pod["containers"]])
    return result


def test_every_pod_fits_the_allocatable_of_the_node_type_it_names(manifest):
    for name, (pod, requests) in pods(ray_cluster(manifest)).items():
        node_type = pod.get("nodeSelector", {}).get("node.kubernetes.io/instance-type")
        assert node_type in NODE_TYPES, f"{name}: names no node type docs/cluster.md sizes ({node_type})"
        cpu, memory_mib = eks_allocatable(*NODE_TYPES[node_type])
        asked_cpu = sum(quantity(r.get("cpu", "0")) for r in requests) * 1000
        asked_mib = sum(quantity(r.get("memory", "0")) for r in requests) / 2**20
        assert asked_cpu <= cpu - DAEMONSETS[0], f"{name}: {asked_cpu:.0f}m CPU on a {node_type} ({cpu}m allocatable)"
        assert asked_mib <= memory_mib - DAEMONSETS[1], f"{name}: {asked_mib:.0f} MiB on a {node_type} ({memory_mib} MiB)"
        assert node_type in (REPO / "docs" / "cluster.md").read_text()


def test_rays_resources_agree_with_the_pods(manifest):
    """What Ray's autoscaler on KubeRay reads each group as (its own derivation from the RayCluster):
    the head holds no trial; a worker holds one doc19 trial (its CPUs and one GPU), with Ray's CPUs
    the container's CPU limit (never above it) and its GPU the one the pod asks for."""
    from ray.autoscaler._private.kuberay.autoscaling_config import _generate_available_node_types_from_ray_cr_spec
    cluster = ray_cluster(manifest)
    node_types = _generate_available_node_types_from_ray_cr_spec(cluster["spec"])
    assert node_types["headgroup"]["resources"]["CPU"] == 0 and "GPU" not in node_types["headgroup"]["resources"]
    doc19 = yaml.safe_load((REPO / "search_spaces" / "doc19.yaml").read_text())
    (group,) = cluster["spec"]["workerGroupSpecs"]
    container = group["template"]["spec"]["containers"][0]["resources"]
    worker = node_types[group["groupName"]]["resources"]
    assert worker["CPU"] == quantity(container["limits"]["cpu"]) >= doc19["base"]["resources"]["cpus_per_worker"]
    assert quantity(container["requests"]["cpu"]) <= quantity(container["limits"]["cpu"])
    assert worker["GPU"] == 1 == quantity(container["requests"]["nvidia.com/gpu"]) == quantity(container["limits"]["nvidia.com/gpu"])


def test_mlflows_readiness_probe_asks_where_mlflow_listens(manifest):
    """The host and port mlflow-server.sh binds (MLFLOW_HOST, MLFLOW_PORT or its defaults) against
    what the probe asks: an httpGet probe asks the pod's IP, which a loopback bind never answers."""
    head = ray_cluster(manifest)["spec"]["headGroupSpec"]["template"]["spec"]
    mlflow = next(c for c in head["containers"] if c["name"] == "mlflow")
    script = (REPO / "cluster" / "mlflow-server.sh").read_text()
    env = {e["name"]: e["value"] for e in mlflow["env"]}
    host = env.get("MLFLOW_HOST") or re.search(r"\$\{MLFLOW_HOST:-([^}]+)\}", script)[1]
    port = int(env.get("MLFLOW_PORT") or re.search(r"\$\{MLFLOW_PORT:-([^}]+)\}", script)[1])
    probe = mlflow["readinessProbe"]
    if "httpGet" in probe:
        asked_host, asked_port = probe["httpGet"].get("host", "the pod's IP"), probe["httpGet"]["port"]
    else:
        asked_host, asked_port = re.search(r"http://([\d.]+):(\d+)/health", " ".join(probe["exec"]["command"])).groups()
    assert host in ("0.0.0.0", asked_host), f"MLflow listens on {host}, its probe asks {asked_host}"
    assert port == int(asked_port)
