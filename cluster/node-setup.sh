#!/usr/bin/env bash
# Set up a node of cluster.yaml (Ray runs it over ssh as the node's first setup command):
#   node-setup.sh head|worker EFS_DNS_NAME
# waits for the package manager, mounts the shared EFS volume, installs the cluster's Python
# (cluster/python-version, the one setting k8s/Dockerfile's image agrees with) and the
# project's .venv (the head with the `aws` extra: boto3 for Ray's AWS provider and MLflow's S3
# artifacts), and writes the environment every later command and trial reads.
#
# A failing step says which, and why, on stderr: Ray's autoscaler logs it on the head
# (/tmp/ray/session_latest/logs/monitor.*, or `ray monitor cluster.yaml` from the laptop). A
# worker also prints a record of the failure, which the head's worker guard (cluster/worker_guard.py)
# copies from the autoscaler's log into the shared volume's failure log (the worker writes it there
# itself when the volume is mounted); after RERANK_LAB_MAX_SETUP_FAILURES (3) failures within two
# hours, workers refuse at once, and the guard stops the autoscaler from launching more (docs/cluster.md).
set -euo pipefail
role="${1:?usage: node-setup.sh head|worker EFS_DNS_NAME}"
efs="${2:?usage: node-setup.sh head|worker EFS_DNS_NAME}"
[[ "$role" == head || "$role" == worker ]] || { echo "node-setup.sh: role must be head or worker, not '$role'" >&2; exit 2; }
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
shared="${RERANK_LAB_SHARED:-/mnt/shared}"   # (both overridable for tests/cluster/test_node_setup.py)
fstab="${RERANK_LAB_FSTAB:-/etc/fstab}"
failures="$shared/cluster/worker-setup-failures.log"
step="start"

on_error() {
    local code=$1 record
    echo "rerank-lab $role setup FAILED on $(hostname) at step '$step' (exit $code); the lines above say why" >&2
    [[ "$role" == worker ]] || return 0
    record="$(date +%s) $(date -Is) $(hostname) step '$step' exit $code"
    if mountpoint -q "$shared"; then
        mkdir -p "$(dirname "$failures")"
        echo "$record" >> "$failures"
    fi
    # Ray's autoscaler runs this script over ssh from the head and writes its stderr into its own log
    # there (monitor.err): the head's worker guard copies this line from that log into $failures
    # (once: written above already when the volume is mounted), so a failure is counted even when the
    # shared volume never mounted (docs/cluster.md, "When a worker's setup fails")
    echo "rerank-lab setup failure record: $record" >&2
}
trap 'on_error $?' ERR

step="wait for the package manager"
# On a fresh Ubuntu, cloud-init and unattended-upgrades hold dpkg's lock for minutes after boot.
sudo cloud-init status --wait > /dev/null 2>&1 || true
sudo systemd-run --quiet --wait --property=After="apt-daily.service apt-daily-upgrade.service" /bin/true 2> /dev/null || true
apt_get() { sudo DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 -y -q "$@"; }
apt_get update
apt_get install nfs-common software-properties-common

step="mount the EFS volume $efs at $shared"
sudo mkdir -p "$shared"
# in fstab, so a rebooted node mounts it again (nofail: it still boots when EFS is unreachable)
options="nfsvers=4.1,rsize=1048576,wsize=1048576,hard,timeo=600,retrans=2,noresvport,_netdev,nofail"
grep -qs " $shared nfs4 " "$fstab" || echo "$efs:/ $shared nfs4 $options 0 0" | sudo tee -a "$fstab" > /dev/null
for attempt in 1 2 3 4 5 6; do
    mountpoint -q "$shared" && break
    sudo mount "$shared" && break
    echo "mount of $efs failed (attempt $attempt): is there a mount target in this node's zone, and does its security" \
         "group accept NFS (TCP 2049) from the nodes' group? (docs/cluster.md, EFS)" >&2
    sleep 10
done
mountpoint -q "$shared"
[[ -O "$shared" ]] || sudo chown "$(id -u):$(id -g)" "$shared"

if [[ "$role" == worker && -f "$failures" ]]; then
    step="check earlier workers' setup failures"
    recent=$(awk -v now="$(date +%s)" '$1 > now - 7200' "$failures" | wc -l)
    if (( recent >= ${RERANK_LAB_MAX_SETUP_FAILURES:-3} )); then
        echo "rerank-lab: $recent GPU workers failed setup in the last two hours ($failures):" >&2
        tail -n 3 "$failures" >&2
        echo "not setting up another; fix the cause, remove $failures, then ray up cluster.yaml again" >&2
        false
    fi
fi

if [[ "$role" == worker ]]; then
    step="check the GPU driver"   # before the ten-minute install, not after it
    bash "$repo/cluster/gpu-check.sh" driver
fi

python_version="$(tr -d '[:space:]' < "$repo/cluster/python-version")"   # the cluster's Python: 3.11, 3.12 or 3.13
step="install Python $python_version"   # Ubuntu 22.04 ships 3.10: deadsnakes has the others
if ! command -v "python$python_version" > /dev/null; then
    sudo add-apt-repository -y -n ppa:deadsnakes/ppa
    apt_get update
    apt_get install "python$python_version" "python$python_version-venv"
fi

step="install the project into $repo/.venv"
cd "$repo"
test -x .venv/bin/python || "python$python_version" -m venv .venv
# The wheelhouse: every wheel the project's pins resolve to, built once by the head on the shared
# volume, so that a new or replacement worker installs without the registry
# (docs/cluster.md, "How a worker starts fast"). It is complete only when COMPLETE holds this
# key, written last; a wheelhouse without it (half built, or for another pyproject.toml) is never used.
wheelhouse="$shared/wheelhouse/$python_version"
wheelhouse_key="python $python_version $(uname -m) pyproject.toml $(sha256sum pyproject.toml | cut -d' ' -f1)"
if [[ "$role" == head ]]; then
    if [[ "$(cat "$wheelhouse/COMPLETE" 2> /dev/null)" == "$wheelhouse_key" ]]; then
        echo "rerank-lab: the wheelhouse $wheelhouse is complete for this pyproject.toml: not rebuilt"
    else
        step="build the wheelhouse $wheelhouse"
        echo "rerank-lab: building the wheelhouse $wheelhouse (once; workers install from it)"
        mkdir -p "$wheelhouse"
        rm -f "$wheelhouse/COMPLETE"   # a rebuild in progress is not complete
        # torch==2.13.0 from PyPI is its CUDA 13.0 build (it requires cuda-toolkit==13.0.3), built
        # here on the CPU head for the GPU workers: same AMI, same platform. pip and setuptools too:
        # the editable install builds the project offline.
        .venv/bin/pip wheel -q --wheel-dir "$wheelhouse" '.[aws]' 'setuptools>=68' pip
        printf '%s\n' "$wheelhouse_key" > "$wheelhouse/COMPLETE.tmp.$$"
        mv -f "$wheelhouse/COMPLETE.tmp.$$" "$wheelhouse/COMPLETE"   # atomic: all or nothing
    fi
    step="install the project into $repo/.venv"
fi
if [[ "$(cat "$wheelhouse/COMPLETE" 2> /dev/null)" == "$wheelhouse_key" ]]; then
    echo "rerank-lab: installing from the wheelhouse $wheelhouse (no registry)"
    pip_install=(.venv/bin/pip install -q --no-index --find-links "$wheelhouse")
else
    # the GPU workers' driver must be 580 or newer for the registry's CUDA 13.0 torch (cluster/gpu-check.sh checked it above)
    echo "rerank-lab: installing from the registry: no complete wheelhouse for this pyproject.toml at $wheelhouse"
    pip_install=(.venv/bin/pip install -q)
fi
"${pip_install[@]}" --upgrade pip
if [[ "$role" == head ]]; then "${pip_install[@]}" -e '.[aws]'; else "${pip_install[@]}" -e .; fi

if [[ "$role" == worker ]]; then
    step="check that torch uses the GPU"
    bash "$repo/cluster/gpu-check.sh" torch
fi

step="write the environment"
# Downloads (Hugging Face, ir_datasets, Anserini's prebuilt indexes), the data and the cache on the shared volume
block="# rerank-lab (cluster/node-setup.sh)
export PATH=$repo/.venv/bin:\$PATH ORCHESTRATE_SHARED_DIR=$shared ORCHESTRATE_CACHE_DIR=$shared/cache ORCHESTRATE_DATA_DIR=$shared/data
export HF_HOME=$shared/cache/huggingface IR_DATASETS_HOME=$shared/cache/ir_datasets ANSERINI_INDEX_CACHE=$shared/cache/anserini-indexes"
grep -q "^# rerank-lab (cluster/node-setup.sh)" ~/.bashrc 2> /dev/null || printf '%s\n' "$block" >> ~/.bashrc
mkdir -p "$shared/cache" "$shared/data"
echo "rerank-lab $role setup done on $(hostname)"
