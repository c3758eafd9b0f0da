"""Write raycluster-v1.schema.json from KubeRay's RayCluster CRD (see README.md here):
the v1 version's openAPIV3Schema, descriptions dropped, and each large subtree that occurs more
than once (the head's and the workers' pod templates, containers and initContainers) kept once
under ``definitions`` and referenced: the same constraints in a file 10x smaller.

    python tests/cluster/kuberay/extract_schema.py ray.io_rayclusters.yaml VERSION COMMIT
"""

import json
import sys
from pathlib import Path

import yaml

MIN_SHARED = 4000  # characters of JSON: smaller repeated subtrees stay inline


def strip(node):
    if isinstance(node, dict):
        return {k: strip(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [strip(v) for v in node]
    return node


def largest_repeated(schema) -> str | None:
    seen: dict[str, int] = {}

    def walk(node):
        if isinstance(node, dict):
            text = json.dumps(node, sort_keys=True)
            if len(text) >= MIN_SHARED and "$ref" not in node:
                seen[text] = seen.get(text, 0) + 1
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    repeated = [text for text, count in seen.items() if count > 1]
    return max(repeated, key=len) if repeated else None


def replace(node, text: str, ref: dict):
    if isinstance(node, dict):
        if json.dumps(node, sort_keys=True) == text:
            return ref
        return {k: replace(v, text, ref) for k, v in node.items()}
    if isinstance(node, list):
        return [replace(v, text, ref) for v in node]
    return node


def extract(crd: dict) -> dict:
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    schema = strip(version["schema"]["openAPIV3Schema"])
    definitions: dict[str, dict] = {}
    while (text := largest_repeated({"root": schema, "definitions": definitions})) is not None:
        name = f"shared{len(definitions)}"
        ref = {"$ref": f"#/definitions/{name}"}
        schema = replace(schema, text, ref)
        definitions = {k: replace(v, text, ref) for k, v in definitions.items()}
        definitions[name] = json.loads(text)
    return {**schema, "definitions": definitions}


def main(crd_file: str, release: str, commit: str) -> None:
    schema = extract(yaml.safe_load(Path(crd_file).read_text()))
    schema = {"$comment": f"KubeRay {release} ({commit}), ray-operator/config/crd/bases/ray.io_rayclusters.yaml, "
                          "version v1's openAPIV3Schema; Apache License 2.0; see README.md", **schema}
    out = Path(__file__).with_name("raycluster-v1.schema.json")
    out.write_text(json.dumps(schema, sort_keys=True, separators=(",", ":")) + "\n")
    print(f"{out}: {out.stat().st_size:,} bytes, {len(schema['definitions'])} shared definitions")


if __name__ == "__main__":
    main(*sys.argv[1:])
