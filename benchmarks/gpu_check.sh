#!/usr/bin/env bash
# The GPU checks, in one call of a lent machine: the CUDA tests (and the timm/HF parity tests,
# whose peers are installed there), `vitkit bench` for ViT-B/16 and L/16 in bf16, and
# benchmarks/peers.py on the GPU suites (then, time allowing, under torch.compile).
# and the training loop against its bare step (benchmarks/loop_overhead.py), eager and compiled.
# Usage: OUT=dir bash benchmarks/gpu_check.sh   (VITKIT_FIXTURES: the official fixtures' folder)
#        SECTIONS="tests loop" OUT=dir bash benchmarks/gpu_check.sh   (some sections only)
set -u
SECTIONS=${SECTIONS:-tests bench peers compile loop}
want() { case " $SECTIONS " in *" $1 "*) return 0;; *) return 1;; esac; }
OUT=${OUT:-benchmarks/out/gpu}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PY:-python3}
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv; \
  $PY -c "import torch,sys;print(sys.version.split()[0],'torch',torch.__version__,torch.version.cuda)"; } 2>&1 | tee "$OUT/env.txt"

if want tests; then
echo "== tests (cuda, peers) =="
timeout 240 $PY -m pytest -q -p no:cacheprovider -m "cuda or peers" tests/test_cuda.py tests/test_peers.py 2>&1 \
  | tee "$OUT/tests.txt" | tail -15
fi

if want bench; then
echo "== vitkit bench =="
for spec in "vit_b16 infer 256" "vit_b16 train 128" "vit_l16 infer 128" "vit_l16 train 64"; do
  set -- $spec
  timeout 120 $PY -m vitkit bench --device cuda --precision bf16 --model "$1" --mode "$2" --batch "$3" \
    --warmup 5 --iters 20 2>&1 | tee -a "$OUT/bench.txt"  # the device tool returns 8 files at most
done
fi

if want peers; then
echo "== peers on the GPU =="
timeout 240 $PY benchmarks/peers.py --device cuda --rounds 3 --iters 10 --warmup 3 --json "$OUT/peers_gpu.json" 2>&1 \
  | tee "$OUT/peers.txt" | grep -v '^{'

fi

if want compile; then
  echo "== peers on the GPU, torch.compile (B/16) =="
  timeout 300 $PY benchmarks/peers.py --device cuda --compile --suite gpu_infer_b16 --suite gpu_train_b16 \
    --rounds 3 --iters 10 --warmup 3 --json "$OUT/peers_gpu_compile.json" 2>&1 | tee "$OUT/peers_compile.txt" | grep -v '^{'
fi

if want loop; then
  echo "== the training loop against its bare step: ViT-B/16, batch 256, bf16 =="
  B16="--config vit_b16_i1k_scratch --data synthetic --set data.options.img_size=224 --set data.options.n=1024 --batch 256 --device cuda"
  timeout 200 $PY benchmarks/loop_overhead.py $B16 --rounds 2 --steps 30 --warmup 10 --json "$OUT/loop_eager.json" 2>&1 \
    | tee "$OUT/loop.txt"
  timeout 330 $PY benchmarks/loop_overhead.py $B16 --compile --rounds 2 --steps 30 --warmup 15 \
    --json "$OUT/loop_compiled.json" 2>&1 | tee -a "$OUT/loop.txt"
fi
