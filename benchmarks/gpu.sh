#!/usr/bin/env bash
# What a CUDA GPU is checked and timed with, in one go (for a machine lent for a short while).
#
#     benchmarks/gpu.sh OUTDIR [tests] [quick] [bench] [first] [output] [speed] [profile]
#                              [large] [graphs] [recvae] [items] [run] [b500] [suite]
#                              [kernels] [score]
#                              (default: tests bench)
#
# tests: tests/training/test_cuda.py and the trainer's CUDA test (every model and precision on the GPU
#        against the CPU, the linear solvers, serving precisions, resume, torchrun with NCCL);
# quick: the part of tests/training/test_cuda.py that the training step's kernels touch (~3 minutes);
# bench: training users/s beside the dense-input PyTorch reference on the same GPU (ML-20M
#        shape, batch 500, every precision), RecVAE's step, and inference latency/throughput;
# items: Mult-VAE and RecVAE training at 100,000 and 500,000 items (users/s, peak GPU memory);
# graphs: 20 ML-20M epochs with and without CUDA graphs (run_time.py --variant);
# recvae: 5 ML-20M epochs of RecVAE with and without graphs;
# run:   the paper's whole ML-20M run (synthetic ML-20M shape, 200 epochs) at bf16, with
#        vaecf's default rows and with the paper's (--preset paper);
# b500:  batch 500's graphed step part by part, then the step and 20 epochs, this code against
#        BEFORE_SRC's (see below);
# suite: core test files with the GPU visible (`auto` devices pick it); give it a call of its own.
# first: the first layer's kernels timed alone at batches 500 and 24,576 (first_layer.py);
# output: the fused output layer and its products with the logits padded to 1, 8 and 64 columns;
# speed: train_speed.py at batches 500 and 24,576, Mult-VAE, Mult-DAE and RecVAE, tf32 and bf16,
#        beside the dense reference (issue 41's table);
# profile: one batch-24,576 bf16 step under torch.profiler, and batch 500's step eagerly;
# kernels: the fused layer's Triton softmax kernels against PyTorch's on the GPU (tests), whole
#        steps with each side by side (softmax_kernels.py), and a batch-24,576 bf16 step
#        kernel by kernel (profile_step.py, eager);
# score: `vaecf score` into parts on the GPU, Mult-VAE over 20,108 items, 200,000 to 10M users
#        (score_memory.py: users/s, peak RSS and GPU memory), and with Polars on 2 threads;
# large: the whole ML-20M-shaped run at NVIDIA's batch (24,576, 200 epochs, bf16) with the
#        auto learning rate (sqrt rule) and a lower one;
# Logs and tables go to OUTDIR; run from the repository root.
set -u
out=${1:?usage: benchmarks/gpu.sh OUTDIR PART... (see the comment above)}
shift
mkdir -p "$out"
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD/src PYTHONUNBUFFERED=1
parts=${*:-tests bench}
py=${PYTHON:-python3}
# what the device's image lacks travels as wheels (polars 1.x cp312 manylinux, tomli_w; made by
# benchmarks/gpu_kit.sh into .whl/, carried): the runs below need both, so say so at once rather
# than after minutes of device time
if ! $py -c "import polars, tomli_w" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
    $py -m pip install -q --no-index --target /tmp/vaecf-wheels .whl/*.whl &&
        export PYTHONPATH=/tmp/vaecf-wheels:$PYTHONPATH
fi
$py -c "import polars, tomli_w" || {
    echo "missing polars or tomli_w: make .whl with benchmarks/gpu_kit.sh and carry it"
    exit 2
}
# the device's image writes no bytecode, so every process compiled torch's sources (7.6 s of
# a run's ~9.8 s start-up under cProfile, 2026-11-28): keep it under /tmp, as an installed
# package's .pyc files would be, and make it once before anything is timed
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-/tmp/vaecf-pycache}
$py -c "import torch._dynamo, vaecf.cli"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
$py -c "import torch; print('torch', torch.__version__, torch.version.cuda)" | tee -a "$out/gpu.txt"
all=(--precision fp32 --precision tf32 --precision bf16 --precision fp16)
for part in $parts; do
    case $part in
    quick)
        # what the GPU path's changes since the last lend touch: the first layer's kernels and the
        # fused loss against the CPU, graphed steps replaying eager ones, bf16 runs against the CPU,
        # the epoch's last batch as a graph of its own, resume
        timeout ${TESTS_TIMEOUT:-300} $py -m pytest tests/training/test_cuda.py -q -rA \
            -k "graphed_step or first_layer_kernels or (trains_like and bf16) or smaller or resume" \
            2>&1 |
            tee "$out/tests_quick.log" | grep -E "passed|failed|error|PASSED|FAILED"
        ;;
    tests)
        timeout ${TESTS_TIMEOUT:-420} $py -m pytest tests/training/test_cuda.py tests/training/test_graphs.py \
            tests/training/test_gradient.py::test_cuda_matches_cpu_closely -q -s -rA 2>&1 |
            tee "$out/tests.log" | grep -E "passed|failed|error|overlap|cpu fp32|full |ease|edlae"
        ;;
    bench)
        timeout 240 $py benchmarks/train_speed.py --device cuda "${all[@]}" --steps 20 --rounds 3 \
            2>&1 | tee "$out/train_speed.txt"
        timeout 120 $py -m vaecf bench train --device cuda "${all[@]}" 2>&1 |
            tee "$out/bench_train.txt"
        timeout 120 $py -m vaecf bench train --device cuda --model recvae --precision fp32 \
            --precision bf16 2>&1 | tee "$out/bench_train_recvae.txt"
        for p in fp32 bf16 fp16 int8; do
            timeout 60 $py -m vaecf bench infer --device cuda --precision $p --seconds 3 2>&1
        done | tee "$out/bench_infer.txt"
        ;;
    first)
        timeout 120 $py benchmarks/first_layer.py --device cuda --precision fp32 --precision tf32 \
            --precision bf16 2>&1 | tee "$out/first_layer.txt"
        ;;
    output)
        timeout 120 $py benchmarks/output_layer.py --device cuda --precision tf32 --precision bf16 \
            2>&1 | tee "$out/output_layer.txt"
        ;;
    speed)
        timeout 240 $py benchmarks/train_speed.py --device cuda --precision tf32 --precision bf16 \
            --batch-size 500 --batch-size 24576 --model multvae --model multdae --model recvae \
            --steps 10 --rounds 2 2>&1 | tee "$out/train_speed.txt"
        ;;
    profile)
        timeout 90 $py benchmarks/profile_step.py --device cuda --precision bf16 \
            --batch-size 24576 --steps 5 --rows 30 2>&1 | tee "$out/profile.txt"
        # batch 500 kernel by kernel: what a replayed graph of the paper's step runs
        timeout 90 $py benchmarks/profile_step.py --device cuda --precision bf16 \
            --batch-size 500 --steps 20 --rows 40 --cuda-graphs false 2>&1 |
            tee "$out/profile500.txt"
        ;;
    large)
        # 116,677 training users: 5 updates an epoch; auto: lr 1e-3 x sqrt(24576 / 500), the
        # KL cap reached after 85% of the 1,000 updates (4,274 annealing steps)
        big="--batch-size 24576 --total-anneal-steps 4274"
        timeout 280 $py benchmarks/run_time.py --datasets ml-20m --device cuda --precision bf16 \
            --only-variants --variant "b24576-lr7e-3=$big --lr 7.011e-3" \
            --variant "b24576-eager=$big --lr 7.011e-3 --cuda-graphs false" 2>&1 | tee "$out/run_large.txt"
        ;;
    graphs)
        timeout 200 $py benchmarks/run_time.py --datasets ml-20m --device cuda --precision bf16 \
            --epochs 20 --variant "eager=--cuda-graphs false" 2>&1 | tee "$out/run_graphs.txt"
        ;;
    recvae)
        timeout 300 $py benchmarks/run_time.py --datasets ml-20m --device cuda --precision bf16 \
            --epochs 5 --variant "rv-eager=--model recvae --cuda-graphs false" \
            --variant "rv-graph=--model recvae" 2>&1 | tee "$out/run_recvae.txt"
        ;;
    items)
        timeout 300 $py benchmarks/train_items.py --device cuda 2>&1 | tee "$out/train_items.txt"
        ;;
    b500)
        # the paper's batch, this code against an older one in one call: BEFORE_SRC is that
        # commit's src (`git archive COMMIT src | tar -x -C .before`, carried: .before/src);
        # the graphed step, each twice in turn, then 20 ML-20M epochs of each; first, this
        # code's replay part by part (probe_b500_parts.py)
        timeout 120 $py benchmarks/probe_b500_parts.py 2>&1 | tee "$out/b500_parts.txt"
        for round in 1 2; do
            for src in ${BEFORE_SRC:-} $PWD/src; do
                echo "== $src"
                PYTHONPATH=$src:$PYTHONPATH timeout 90 $py -m vaecf bench train --device cuda \
                    --precision bf16 --batch-size 500 --steps 300 --warmup 30
            done
        done 2>&1 | tee "$out/b500_step.txt"
        timeout 300 $py benchmarks/run_time.py --datasets ml-20m --device cuda --precision bf16 \
            --epochs 20 ${BEFORE_SRC:+--before $BEFORE_SRC} 2>&1 | tee "$out/b500_run.txt"
        ;;
    run)
        # vaecf's default trains Mult-VAE on the held-out users' fold-in rows too (136,677 rows an
        # epoch); the paper's protocol (--preset paper) on the 116,677 training users alone
        timeout ${RUN_TIMEOUT:-590} $py benchmarks/run_time.py --datasets ml-20m --device cuda --precision bf16 \
            --variant "paper=--preset paper" 2>&1 | tee "$out/run_ml20m.txt"
        ;;
    kernels)
        timeout 150 $py -m pytest tests/training/test_cuda.py -q -rA -k "fused_loss or graphed_step" \
            2>&1 | tee "$out/tests_kernels.log" | grep -E "passed|failed|error|PASSED|FAILED"
        timeout 150 $py benchmarks/softmax_kernels.py --batch-size 500 --batch-size 24576 \
            --precision bf16 --steps 40 --rounds 1 2>&1 | tee "$out/softmax_kernels.txt"
        timeout 90 $py benchmarks/profile_step.py --device cuda --precision bf16 \
            --batch-size 24576 --steps 5 --rows 40 --cuda-graphs false --shapes 2>&1 | tee "$out/profile.txt"
        ;;
    score)
        timeout ${SCORE_TIMEOUT:-300} $py benchmarks/score_memory.py --device cuda --model multvae \
            --items 20108 --users ${SCORE_USERS:-200000,800000,3200000,10000000} --batch-users 8192 \
            --workdir /tmp/score 2>&1 | tee "$out/score_gpu.txt"
        # the host's peak with Polars on 2 threads, as on a 2-core machine
        POLARS_MAX_THREADS=2 timeout 120 $py benchmarks/score_memory.py --device cuda \
            --model multvae --items 20108 --users 200000,3200000 --batch-users 8192 \
            --workdir /tmp/score 2>&1 | tee "$out/score_gpu_2threads.txt"
        ;;
    suite)
        # not in parallel: 8 xdist workers on one GPU gave no result in 230 s (2026-11-25)
        timeout 540 $py -m pytest -q -p no:cacheprovider --durations=10 tests/training/test_gradient.py \
            tests/test_recommender.py tests/models/test_serving_copy.py 2>&1 | tee "$out/suite.log" |
            tail -25
        ;;
    esac
done
