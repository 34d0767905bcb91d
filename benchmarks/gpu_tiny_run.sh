#!/usr/bin/env bash
# Issue 38 on one GPU, as it was run on the lent H100 (2026-12-07): the image's environment as it comes, a fresh
# HOME and no inductor cache per run, `dflashx run recipes/tiny.yaml hardware=local` with the pilot and preflight on
# (DFlash, DFlash2), each run's plan against its stages (benchmarks/tiny_run.py at +-25%);
# then the trainer step beside f5ac536's, interleaved (benchmarks/train_step_vs.py), in what time is left.
# Needs: dflashx's missing dependencies as wheels in .whl/ (../shared/tools/device-wheels.sh, torch, nvidia-*,
# triton, transformers and cuda-* wheels deleted), f5ac536's package in .devrun/f5ac536/
# (`git archive f5ac536 dflashx | tar -x -C .devrun/f5ac536`); writes to $OUT. SKIP_TINY=1 / SKIP_BENCH=1 / ROUNDS=2 / ONLY=dflash|dflash2.
set -u
export PYTHONUNBUFFERED=1
T0=$SECONDS
LIMIT=${LIMIT:-570}
# as `pip install dflashx` leaves them: dflashx and the dependencies the image lacks byte-compiled at install
# (pip compiles by default; a process that imports uncompiled modules compiles them again each time when the
# image sets PYTHONDONTWRITEBYTECODE), the image's own packages as they come
python3 -m pip install -q --upgrade --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
python3 -m compileall -q -j 0 dflashx benchmarks > /dev/null
export PYTHONPATH=/tmp/site:$PWD
echo "PYTHONDONTWRITEBYTECODE=${PYTHONDONTWRITEBYTECODE-unset}; transformers byte-compiled in the image:" \
    $(python3 -c "import pathlib, transformers; print(any(pathlib.Path(transformers.__file__).parent.glob('__pycache__/*.pyc')))")
export HOME=$(mktemp -d)  # no extensions, no inductor cache, no tiny target
echo "TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST-unset}"; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -c "import torch, transformers, deepspeed; print(torch.__version__, transformers.__version__, deepspeed.__version__)"
python3 -m dflashx.cli.main profiles --show local 2>&1 | tail -15
run() {  # name, overrides...
  local name=$1; shift
  export HOME=$(mktemp -d); rm -rf /tmp/torchinductor_* /tmp/runs/$name  # each run cold: no tiny target, no compile caches
  local start=$(date +%s.%N)
  timeout ${BUDGET:-150} python3 -m dflashx.cli.main run recipes/tiny.yaml hardware=local tracking.mode=disabled \
      --run-dir /tmp/runs/$name "$@" > $OUT/$name.log 2>&1
  local rc=$? end=$(date +%s.%N)
  echo "== $name: exit $rc in $(python3 -c "print(f'{$end - $start:.1f}')") s (wall: the process's start to its end)"
  sed "s/\x1b\[[0-9;]*m//g" $OUT/$name.log | grep -E "^[0-9:]{8} [+~>]|round trip|Error|error" | tail -25 | cut -c1-160
  python3 -m benchmarks.tiny_run --from /tmp/runs/$name --tolerance 1.25 --out $OUT/$name.tiny_run.json 2>&1 | grep -v "^note" | head -12
  (cd /tmp/runs && tar czf $OUT/$name.tgz --exclude='*.safetensors' --exclude='*.pt' --exclude='*.bin' \
      --exclude='dataset' --exclude='completions' --exclude='wandb' $name) 2>/dev/null
}
if [ -z "${SKIP_TINY-}" ]; then
  for round in $(seq ${ROUNDS:-1}); do  # ROUNDS=2: each architecture again on the same machine (its files cached)
    [ "${ONLY-}" != dflash2 ] && BUDGET=130 run dflash-r$round
    [ "${ONLY-}" != dflash ] && BUDGET=130 run dflash2-r$round drafter.architecture=dflash2
  done
fi
[ -n "${SKIP_BENCH-}" ] && { echo "== all done in $((SECONDS - T0)) s"; exit 0; }
left=$((LIMIT - (SECONDS - T0)))
echo "== trainer step vs f5ac536 with $left s left"
if [ $left -gt 90 ]; then
  timeout $left python3 -m benchmarks.train_step_vs --baseline .devrun/f5ac536 --label f5ac536 \
      --repeats ${REPEATS:-5} --out $OUT/train_step_vs.json 2>&1 | grep -v Warning | tail -40
fi
echo "== all done in $((SECONDS - T0)) s"
