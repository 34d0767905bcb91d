"""Throughput of the S3 store against a local SeaweedFS: hash, upload (+ verify), download.

    python -P benchmarks/store_throughput.py [--mib 256] [--part-mib 16]

(-P: benchmarks/tokenize.py would otherwise shadow the standard library module.)

Starts its own `weed mini` (.ci/start-s3.sh, through tests/s3_fixtures.py), prints a table and
writes benchmarks/results/store_throughput.json. Loopback numbers: they measure our overhead
(hashing, read-back verification, state files), not a network.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

from dflashx.config.schema import S3Spec
from dflashx.store.hashing import sha256_file
from dflashx.store.s3 import S3Store

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from s3_fixtures import start_server, stop_server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--part-mib", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        server, pid = start_server(tmp / "weed")
        try:
            os.environ["AWS_ACCESS_KEY_ID"] = server.access_key
            os.environ["AWS_SECRET_ACCESS_KEY"] = server.secret_key
            bucket = f"bench-{uuid.uuid4().hex[:8]}"
            server.client().create_bucket(Bucket=bucket)
            spec = S3Spec(bucket=bucket, endpoint_url=server.endpoint, region="us-east-1",
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
            stop_server(pid)
    rows = {k: {"seconds": round(v, 3), "mib_per_s": round(size / 2**20 / v, 1)} for k, v in timings.items()}
    print(f"{'operation':36s} {'seconds':>8s} {'MiB/s':>8s}   ({args.mib} MiB, {args.part_mib} MiB parts)")
    for name, row in rows.items():
        print(f"{name:36s} {row['seconds']:8.2f} {row['mib_per_s']:8.1f}")
    out = ROOT / "benchmarks/results/store_throughput.json"
    out.write_text(json.dumps({"mib": args.mib, "part_mib": args.part_mib, "results": rows}, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
