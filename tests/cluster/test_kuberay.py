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
    assert mlflow["command"][-1].endswith("cluster/mlflow-server.sh") and mlflow["readinessProbe"]["httpGet"]["port"] == 5000
