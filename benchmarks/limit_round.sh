#!/usr/bin/env bash
# The measurements of the "closer to the limit" work on one H200, in parts that each fit one
# 10-minute call on a warm machine (results under $OUT, at most 8 files a call):
#
#   benchmarks/limit_round.sh tests     # the GPU tests (-m gpu), PDL's and the kernels' included
#   benchmarks/limit_round.sh batch1    # batch-1 decode, six variants of the projection path
#                                       # (plain / fused_onepass), PDL and the RoPE fold, for
#                                       # llama-1b, qwen3-0.6b, smollm2-135m (the staged GGUF)
#   benchmarks/limit_round.sh batch1-8b # the same for llama-3-8b
#   benchmarks/limit_round.sh batches   # batch 8 / 64 / 256: cuBLAS against the Triton decode
#                                       # GEMM (with PDL and the fold), llama-1b and qwen3-0.6b
#   benchmarks/limit_round.sh batches-8b # the same for llama-3-8b
#   benchmarks/limit_round.sh kernels   # GEMV, decode GEMM, split-KV attention, the RoPE fold and
#                                       # the decode attention's launch shapes against their
#                                       # alternatives (cuBLAS, the unsplit kernel, two launches)
#   benchmarks/limit_round.sh startup   # start-up per phase and the HF transformers ratios
#
# Each part prints its tables and writes <part>.log and its JSON files under $OUT (default
# ./limit-round). Set PYTHON to the interpreter (default python3).
set -uo pipefail
part="${1:?usage: limit_round.sh tests|batch1|batch1-8b|batches|batches-8b|kernels|startup}"
out="${OUT:-limit-round}"
py="${PYTHON:-python3}"
mkdir -p "$out"
cd "$(dirname "$0")/.." || exit 2
log="$out/$part.log"

case "$part" in
tests)
    $py -m pytest -m gpu -q -p no:cacheprovider tests 2>&1 | tail -n 60 | tee "$log"
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
    $py benchmarks/decode_roofline.py --batches 8 64 256 "${presets[@]}" \
        --variant plain --variant plain+gemm --variant plain+pdl+fold+gemm \
        --out "$out/$part.json" 2>&1 | tee "$log"
    ;;
kernels)
    {
        $py benchmarks/gemv.py --out "$out/gemv.json"
        $py benchmarks/decode_gemm.py --out "$out/decode_gemm.json"
        $py benchmarks/attention_split_kv.py --out "$out/split_kv.json"
        $py benchmarks/attention_triton.py --decode-batches 1 8 64 256 --sweep \
            --skip-reference --out "$out/attention.json"
    } 2>&1 | tee "$log"
    ;;
startup)
    {
        $py benchmarks/startup.py --presets llama-1b llama-3-8b --repeats 2 \
            --out "$out/startup.json"
        $py benchmarks/peer_transformers.py --preset llama-1b --preset llama-3-8b \
            --preset smollm2-135m --out "$out/peer.json"
    } 2>&1 | tee "$log"
    ;;
*)
    echo "limit_round.sh: unknown part '$part' (tests, batch1, batch1-8b, batches, batches-8b, kernels, startup)" >&2
    exit 2
    ;;
esac
