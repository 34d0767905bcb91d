"""Kill the generate stage (a subprocess) with SIGKILL at random points, resume, and check the data.

After several kills and a final uninterrupted run, every prompt id appears exactly once and every
completion is whole (the scripted server's reply for that prompt, byte for byte). This file is also
the child: `python tests/test_generate_resume.py RUN_DIR URL` runs the stage once.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers_models import make_recipe, stage_context
from openai_server import Script, ScriptedOpenAIServer, expected_reply

from dflashx.data.jsonl import count_records, iter_shards, write_jsonl_atomic

N_PROMPTS = 400


def child(run_dir: Path, url: str) -> None:
    """Run the generate stage once against `url` (the subprocess body)."""
    from dflashx.stages import generate

    stages = {"generate": {"backend": "sglang", "urls": [url], "concurrency": 2, "flush_every": 5,
                           "shard_size": 64, "retry_backoff_s": 0.01, "server_startup_timeout_s": 30}}
    ctx = stage_context("generate", make_recipe(stages=stages), run_dir,
                        inputs={"ingest.prompts": run_dir / "ingest" / "prompts"})
    generate.run(ctx)


def start_child(run_dir: Path, url: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, __file__, str(run_dir), url],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


@pytest.mark.slow  # a generate subprocess killed and resumed again and again
@pytest.mark.timeout(240)
def test_sigkill_at_random_points_then_resume(tmp_path):
    rng = random.Random(20261202)
    run_dir = tmp_path / "run"
    rows = [{"id": f"id{i:04d}", "source": "s", "messages": [{"role": "user", "content": f"prompt {i}"}]}
            for i in range(N_PROMPTS)]
    write_jsonl_atomic(run_dir / "ingest" / "prompts" / "shard-00000.jsonl", rows)
    out = run_dir / "generate" / "completions"
    kills = 0
    with ScriptedOpenAIServer(Script(delay_s=0.01, jitter_s=0.02)) as server:
        for _ in range(5):
            before = count_records(out) if out.exists() else 0
            proc = start_child(run_dir, server.url)
            while proc.poll() is None and (count_records(out) if out.exists() else 0) <= before:
                time.sleep(0.01)
            time.sleep(rng.uniform(0.0, 0.4))
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                kills += 1
            proc.wait()
            assert proc.returncode in (0, -signal.SIGKILL), proc.stderr.read().decode()[-2000:]
            proc.stderr.close()
        final = subprocess.run([sys.executable, __file__, str(run_dir), server.url],
                               capture_output=True, text=True, timeout=180)
    assert final.returncode == 0, final.stderr[-2000:]
    assert kills >= 3

    records = list(iter_shards(out))
    ids = [r["id"] for r in records]
    assert len(ids) == len(set(ids)) == N_PROMPTS
    assert sorted(ids) == [r["id"] for r in rows]
    for r in records:
        assert (r["reasoning"], r["answer"]) == expected_reply(r["messages"]), r["id"]
        assert r["finish_reason"] == "stop"


if __name__ == "__main__":
    child(Path(sys.argv[1]), sys.argv[2])
