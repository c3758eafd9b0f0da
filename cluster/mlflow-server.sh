#!/usr/bin/env bash
# The head's MLflow tracking server, in the foreground (cluster/service.sh supervises it):
# the run store in SQLite on the shared volume, artifacts in S3 (boto3 comes with the `aws`
# extra the head installs) or, without S3, in a directory on the shared volume. Loopback only:
# reach it from a laptop through `ray attach cluster.yaml -p 5000` or an SSH tunnel (docs/cluster.md).
#
# Environment: MLFLOW_HOST (127.0.0.1), MLFLOW_PORT (5000), MLFLOW_BACKEND_STORE_URI
# (sqlite:////mnt/shared/mlflow.db), MLFLOW_ARTIFACTS_DESTINATION (s3://BUCKET/PREFIX or a
# directory; default /mnt/shared/mlflow-artifacts), MLFLOW_BIN (the project's .venv/bin/mlflow; a name is looked up on PATH).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mlflow="$(command -v "${MLFLOW_BIN:-$here/../.venv/bin/mlflow}")" || { echo "mlflow-server.sh: no ${MLFLOW_BIN:-$here/../.venv/bin/mlflow}" >&2; exit 3; }
artifacts="${MLFLOW_ARTIFACTS_DESTINATION:-/mnt/shared/mlflow-artifacts}"
if [[ "$artifacts" == s3://* ]] && ! "$(dirname "$mlflow")/python" -c "import boto3" 2>/dev/null; then
    echo "mlflow-server.sh: artifacts go to $artifacts but boto3 is not installed: pip install -e '.[aws]'" >&2
    exit 3
fi
# Job execution off: a sweep's driver is the only writer, and the server then starts no workers of its own.
export MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false
exec "$mlflow" server --host "${MLFLOW_HOST:-127.0.0.1}" --port "${MLFLOW_PORT:-5000}" --workers 1 \
    --backend-store-uri "${MLFLOW_BACKEND_STORE_URI:-sqlite:////mnt/shared/mlflow.db}" \
    --artifacts-destination "$artifacts"
