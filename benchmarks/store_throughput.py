"""Throughput of the S3 store against a local SeaweedFS: hash, upload (+ verify), download.

    python benchmarks/store_throughput.py [--mib 256] [--part-mib 16]

Starts `weed mini` through .ci/start-s3.sh unless DFLASHX_TEST_S3_ENDPOINT is set, prints a table
and writes benchmarks/results/store_throughput.json. Loopback numbers: they measure our overhead
(hashing, read-back verification, state files), not a network.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import boto3
from botocore.config import Config

from dflashx.config.schema import S3Spec
from dflashx.store.hashing import sha256_file
from dflashx.store.s3 import S3Store

ROOT = Path(__file__).resolve().parents[1]


def _server(tmp: Path) -> tuple[dict[str, str], int | None]:
    if os.environ.get("DFLASHX_TEST_S3_ENDPOINT"):
        return dict(os.environ), None
    out = subprocess.run(["bash", str(ROOT / ".ci/start-s3.sh")], capture_output=True, text=True, check=True,
                         env={**os.environ, "DFLASHX_TEST_S3_DIR": str(tmp / "weed")})
    env = dict(line.removeprefix("export ").split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    return env, int(env["DFLASHX_TEST_S3_PID"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--part-mib", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        env, pid = _server(tmp)
        try:
            os.environ["AWS_ACCESS_KEY_ID"] = env["DFLASHX_TEST_S3_ACCESS_KEY"]
            os.environ["AWS_SECRET_ACCESS_KEY"] = env["DFLASHX_TEST_S3_SECRET_KEY"]
            bucket = f"bench-{uuid.uuid4().hex[:8]}"
            boto3.client("s3", endpoint_url=env["DFLASHX_TEST_S3_ENDPOINT"], region_name="us-east-1",
                         config=Config(s3={"addressing_style": "path"})).create_bucket(Bucket=bucket)
            spec = S3Spec(bucket=bucket, endpoint_url=env["DFLASHX_TEST_S3_ENDPOINT"], region="us-east-1",
                          path_style=True, part_size=args.part_mib * 2**20)
            store = S3Store(spec, tmp / "state")
            src = tmp / "blob.bin"
            with open(src, "wb") as f:
                f.writelines(os.urandom(2**20) for _ in range(args.mib))
            size = src.stat().st_size
            timings = {}
            t = time.perf_counter()
            sha = sha256_file(src)
            timings["sha256 (local)"] = time.perf_counter() - t
            t = time.perf_counter()
            store.put(src, "blob.bin", sha)
            timings["put = upload + read-back verify"] = time.perf_counter() - t
            t = time.perf_counter()
            store.verify("blob.bin", sha)
            timings["verify (read back + hash)"] = time.perf_counter() - t
            t = time.perf_counter()
            store.get("blob.bin", tmp / "back.bin")
            timings["get = download + hash"] = time.perf_counter() - t
        finally:
            if pid is not None:
                os.kill(pid, signal.SIGTERM)
    rows = {k: {"seconds": round(v, 3), "mib_per_s": round(size / 2**20 / v, 1)} for k, v in timings.items()}
    print(f"{'operation':36s} {'seconds':>8s} {'MiB/s':>8s}   ({args.mib} MiB, {args.part_mib} MiB parts)")
    for name, row in rows.items():
        print(f"{name:36s} {row['seconds']:8.2f} {row['mib_per_s']:8.1f}")
    out = ROOT / "benchmarks/results/store_throughput.json"
    out.write_text(json.dumps({"mib": args.mib, "part_mib": args.part_mib, "results": rows}, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
