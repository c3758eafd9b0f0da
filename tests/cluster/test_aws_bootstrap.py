"""cluster.yaml through Ray's own AWS bootstrap and node provider, against AWS mocked in process
(moto): what `ray up` does on the laptop, then what the head's autoscaler does when trials ask for
GPUs. Set up as docs/cluster.md says (the head's role and instance profile from cluster/iam/, the
nodes' security group); the AMI is EC2's resolution of the public SSM parameter cluster.yaml names.
moto enforces no IAM policy: the head's policy is checked against the API calls the head makes
here, recorded as they happen, and against a list read from Ray's provider source."""

import fnmatch
import json
import re
import time
import tomllib
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
IAM = REPO / "cluster" / "iam"
REGION = "us-east-1"
DLAMI_PARAMETER = "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"

# What the head's autoscaler asks AWS for, read from Ray 2.60's provider
# (ray/autoscaler/_private/aws/node_provider.py) for cluster.yaml's settings:
HEAD_CALLS_FROM_RAY_SOURCE = {
    "ec2:DescribeInstances",      # non_terminated_nodes, _get_node: ec2.instances.filter
    "ec2:RunInstances",           # _create_node: ec2.create_instances
    "ec2:CreateTags",             # set_node_tags (batched create_tags), and RunInstances' TagSpecifications
    "ec2:TerminateInstances",     # terminate_node(s) with cache_stopped_nodes: false
    "ec2:DescribeInstanceTypes",  # fillout_available_node_types_resources, when a config is prepared
    "ssm:GetParameters",          # EC2 resolving ImageId resolve:ssm:... for RunInstances, as the caller
    "iam:CreateServiceLinkedRole",  # the account's first spot launch creates AWSServiceRoleForEC2Spot
}
# ...and what it does not need with this file: StopInstances/StartInstances (only with
# cache_stopped_nodes: true), iam:PassRole (the workers have no instance profile),
# DescribeImages (only with the CloudWatch agent configured), IAM and key-pair calls (only in
# bootstrap_aws, run by `ray up` on the laptop with the user's own credentials).
NOT_NEEDED = {"ec2:StopInstances", "ec2:StartInstances", "iam:PassRole", "ec2:DescribeImages", "iam:CreateRole"}


@pytest.fixture()
def aws(monkeypatch, tmp_path):
    moto = pytest.importorskip("moto")
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing",
                       "AWS_DEFAULT_REGION": REGION}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("HOME", str(tmp_path))  # Ray writes the key pair it creates to ~/.ssh
    from ray.autoscaler._private.aws import config as aws_config
    from ray.autoscaler._private.aws import utils

    for cached in (utils.resource_cache, utils.client_cache, aws_config._get_subnets_or_die):
        cached.cache_clear()  # boto3 clients made outside this mock must not be reused
    with moto.mock_aws():
        yield
    for cached in (utils.resource_cache, utils.client_cache, aws_config._get_subnets_or_die):
        cached.cache_clear()


def publish_dlami(ami_id: str) -> None:
    """AWS publishes the DLAMI's id as a public parameter; moto refuses user writes under /aws."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.ssm.models import Parameter, ssm_backends

    backend = ssm_backends[DEFAULT_ACCOUNT_ID][REGION]
    backend._parameters[DLAMI_PARAMETER].append(Parameter(
        account_id=DEFAULT_ACCOUNT_ID, name=DLAMI_PARAMETER, value=ami_id, parameter_type="String", description=None,
        allowed_pattern=None, keyid=None, last_modified_date=time.time(), version=1,
        data_type="aws:ec2:image"))


def set_up_account() -> dict:
    """docs/cluster.md's one-time steps: the head's role, policy and instance profile; the nodes'
    security group. Returns the placeholders' values."""
    import boto3

    iam = boto3.client("iam")
    iam.create_role(RoleName="rerank-lab-head", AssumeRolePolicyDocument=(IAM / "ec2-trust.json").read_text())
    iam.put_role_policy(RoleName="rerank-lab-head", PolicyName="rerank-lab-head", PolicyDocument=(IAM / "head-policy.json").read_text())
    iam.create_instance_profile(InstanceProfileName="rerank-lab-head")
    iam.add_role_to_instance_profile(InstanceProfileName="rerank-lab-head", RoleName="rerank-lab-head")
    ec2 = boto3.client("ec2", REGION)
    vpc = ec2.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])["Vpcs"][0]["VpcId"]
    group = ec2.create_security_group(GroupName="rerank-lab-nodes", Description="rerank-lab nodes", VpcId=vpc)["GroupId"]
    ec2.authorize_security_group_ingress(GroupId=group, IpPermissions=[
        {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": group}]},
        {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, "IpRanges": [{"CidrIp": "203.0.113.7/32"}]}])
    ami = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    publish_dlami(ami)
    return {"sg-REPLACE": group, "ami": ami, "vpc": vpc}


def cluster_config(values: dict) -> dict:
    text = (REPO / "cluster.yaml").read_text().replace("sg-REPLACE", values["sg-REPLACE"])
    return yaml.safe_load(text)


def resolve_image(image_id: str) -> str:
    """What EC2 does with an ImageId at launch: ``resolve:ssm:NAME`` is the parameter's value."""
    import boto3

    if not image_id.startswith("resolve:ssm:"):
        return image_id
    name = image_id.removeprefix("resolve:ssm:")
    return boto3.client("ssm", REGION).get_parameters(Names=[name])["Parameters"][0]["Value"]


def as_list(value) -> list:
    return [value] if isinstance(value, str) else list(value)


def policy_allows(policy: dict, action: str) -> bool:
    return any(statement["Effect"] == "Allow" and any(fnmatch.fnmatchcase(action, pattern) for pattern in as_list(statement["Action"]))
               for statement in policy["Statement"])


class ApiCalls:
    """Every AWS API call made through boto3's default session, as IAM actions (ec2:RunInstances)."""

    def __init__(self):
        import boto3

        boto3.setup_default_session(region_name=REGION)
        self.actions: list[str] = []
        boto3.DEFAULT_SESSION.events.register("before-call", self._record)

    def _record(self, model, **_):
        self.actions.append(f"{model.service_model.signing_name}:{model.name}")


def test_the_head_installs_boto3_for_rays_aws_provider():
    # Ray's AWS node provider imports boto3 when the autoscaler loads it; the head's .venv gets it from the aws extra
    setup = yaml.safe_load((REPO / "cluster.yaml").read_text())["head_setup_commands"]
    assert any("cluster/node-setup.sh head" in command for command in setup)
    # (from the wheelhouse or the registry: test_node_setup runs both)
    assert """if [[ "$role" == head ]]; then "${pip_install[@]}" -e '.[aws]'""" in (REPO / "cluster" / "node-setup.sh").read_text()
    aws_extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"].get("aws", [])
    assert any(r.startswith("boto3") for r in aws_extra), "pyproject.toml has no aws extra with boto3"
    import boto3  # and this environment, installed with it, has it

    assert boto3.__version__
    from ray.autoscaler._private.providers import _get_node_provider_cls

    assert _get_node_provider_cls({"type": "aws"}).__name__ == "AWSNodeProvider"


def test_ray_up_bootstrap_resolves_every_resource(aws, tmp_path):
    from ray.autoscaler._private.commands import _bootstrap_config
    from ray.autoscaler._private.util import prepare_config

    values = set_up_account()
    config = _bootstrap_config(prepare_config(cluster_config(values)), no_config_cache=True)
    import boto3

    ec2 = boto3.client("ec2", REGION)
    head, worker = (config["available_node_types"][t]["node_config"] for t in ("head", "gpu_worker"))
    for node in (head, worker):
        assert node["SecurityGroupIds"] == [values["sg-REPLACE"]]
        subnets = ec2.describe_subnets(SubnetIds=node["SubnetIds"])["Subnets"]
        # in the nodes' group's VPC and only in the zones listed (each one has an EFS mount target)
        assert subnets and {s["VpcId"] for s in subnets} == {values["vpc"]}
        assert {s["AvailabilityZone"] for s in subnets} == set(config["provider"]["availability_zone"].split(","))
        # Ray keeps the ImageId as written; EC2 resolves it from the public DLAMI parameter
        assert node["ImageId"] == f"resolve:ssm:{DLAMI_PARAMETER}"
        assert ec2.describe_images(ImageIds=[resolve_image(node["ImageId"])])["Images"]
        # Ray created a key pair (none is named in cluster.yaml) and wrote its private key
        assert node["KeyName"] == f"ray-autoscaler_{REGION}"
    assert ec2.describe_key_pairs(KeyNames=[head["KeyName"]])["KeyPairs"]
    assert Path(config["auth"]["ssh_private_key"]).is_file()
    # the head keeps its named profile (so Ray adds no default role); the workers get none
    assert head["IamInstanceProfile"] == {"Name": "rerank-lab-head"} and config["head_node"] == {}
    assert "IamInstanceProfile" not in worker
    profile = boto3.client("iam").get_instance_profile(InstanceProfileName="rerank-lab-head")["InstanceProfile"]
    assert [r["RoleName"] for r in profile["Roles"]] == ["rerank-lab-head"]
    # the resources stated survive Ray's fill-in (it adds memory and the accelerator type): the sweep reads them
    resources = {t: config["available_node_types"][t]["resources"] for t in ("head", "gpu_worker")}
    assert resources["gpu_worker"]["CPU"] == 4 and resources["gpu_worker"]["GPU"] == 1 and resources["head"]["CPU"] == 0


def test_the_heads_autoscaler_launches_and_ends_spot_workers_within_its_policy(aws, tmp_path):
    from ray.autoscaler._private.aws.node_provider import AWSNodeProvider
    from ray.autoscaler._private.commands import _bootstrap_config
    from ray.autoscaler._private.util import prepare_config
    from ray.autoscaler.tags import TAG_RAY_NODE_KIND, TAG_RAY_NODE_STATUS, TAG_RAY_USER_NODE_TYPE

    calls = ApiCalls()  # before Ray makes (and caches) its boto3 resources
    values = set_up_account()
    config = _bootstrap_config(prepare_config(cluster_config(values)), no_config_cache=True)
    calls.actions.clear()  # from here on: the head's autoscaler, with the head's role
    provider = AWSNodeProvider(config["provider"], config["cluster_name"])
    node_config = dict(config["available_node_types"]["gpu_worker"]["node_config"])
    node_config["ImageId"] = resolve_image(node_config["ImageId"])  # EC2's part of RunInstances (moto leaves it out)
    calls.actions.append("ssm:GetParameters")
    for _ in range(2):  # (moto launches MinCount of a MinCount..MaxCount request: one node per call)
        provider.create_node(node_config, {TAG_RAY_NODE_KIND: "worker", TAG_RAY_USER_NODE_TYPE: "gpu_worker"}, 1)
    nodes = provider.non_terminated_nodes({TAG_RAY_USER_NODE_TYPE: "gpu_worker"})
    assert len(nodes) == 2
    import boto3

    instances = [i for r in boto3.client("ec2", REGION).describe_instances(InstanceIds=nodes)["Reservations"] for i in r["Instances"]]
    assert {i["InstanceType"] for i in instances} == {"g5.xlarge"}
    assert all(i.get("InstanceLifecycle") == "spot" and "IamInstanceProfile" not in i for i in instances)
    provider.set_node_tags(nodes[0], {TAG_RAY_NODE_STATUS: "update-failed"})
    provider.terminate_nodes(nodes)
    assert provider.non_terminated_nodes({TAG_RAY_USER_NODE_TYPE: "gpu_worker"}) == []

    policy = json.loads((IAM / "head-policy.json").read_text())
    made = set(calls.actions)
    assert {"ec2:RunInstances", "ec2:DescribeInstances", "ec2:CreateTags", "ec2:TerminateInstances"} <= made
    assert made <= HEAD_CALLS_FROM_RAY_SOURCE, f"calls Ray's provider made that the list above lacks: {made - HEAD_CALLS_FROM_RAY_SOURCE}"
    missing = sorted(a for a in HEAD_CALLS_FROM_RAY_SOURCE if not policy_allows(policy, a))
    assert not missing, f"the head's policy (cluster/iam/head-policy.json) does not allow {missing}"
    assert not any(policy_allows(policy, a) for a in NOT_NEEDED)  # least privilege
    # S3 for MLflow's artifacts: the bucket cluster.yaml names, listing and object read/write/delete
    bucket = re.search(r"s3://([\w.-]+)", (REPO / "cluster.yaml").read_text()).group(1)
    s3 = [s for s in policy["Statement"] if any(r.startswith(f"arn:aws:s3:::{bucket}") for r in as_list(s["Resource"]))]
    assert {"s3:ListBucket", "s3:GetObject", "s3:PutObject", "s3:DeleteObject"} <= {a for s in s3 for a in as_list(s["Action"])}


def test_the_docs_create_what_the_test_creates():
    # the steps above are the document's: the same files, names and parameter
    doc = (REPO / "docs" / "cluster.md").read_text()
    for needle in ("cluster/iam/head-policy.json", "cluster/iam/ec2-trust.json", "rerank-lab-head", DLAMI_PARAMETER,
                   "create-security-group", "create-mount-target", "2049", "ray attach cluster.yaml -p 5000"):
        assert needle in doc, needle
