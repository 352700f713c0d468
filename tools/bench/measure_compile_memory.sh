#!/usr/bin/env bash
# Peak RSS of `asapc compile` at two calibration sizes 8x apart (64 and 512
# examples of the bundled calibration set), written to docs/compile-memory.md.
# Usage: tools/bench/measure_compile_memory.sh [ASAPC]   (after tools/setup.sh)
set -euo pipefail
cd "$(dirname "$0")/../.."
asapc=${1:-build/asapc}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
rows=""
for n in 64 512; do
  /usr/bin/time -v "$asapc" compile calib_data/vit_mnist_t6.pt --spec calib_data/vit_mnist_t6.spec.json \
    --calib calib_data/vit_mnist_t6.calib.h5 --max-examples "$n" -o "$tmp/a.h5" --no-report -q \
    > /dev/null 2> "$tmp/time.txt"
  rss=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$tmp/time.txt")
  wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {print $2}' "$tmp/time.txt")
  rows+="| $n | $((rss / 1024)) MiB | $wall |"$'\n'
  echo "examples $n: peak RSS $((rss / 1024)) MiB, wall $wall" >&2
done
cpu=$(lscpu | awk -F': *' '/Model name/ {print $2; exit}')
cat > docs/compile-memory.md <<MD
# Compile memory at two calibration sizes

\`asapc compile\` streams the calibration file in bounded batches (\`--batch-size\`,
16 by default). It keeps per-head sufficient statistics of size \`P×P\` per layer
and the indices of held-out examples, so its peak memory should not grow with
the number of examples \`N\`.

Measured by \`tools/bench/measure_compile_memory.sh\` on the bundled MNIST teacher
(\`calib_data/vit_mnist_t6.*\`, n = 17 tokens, 2 layers), with \`--max-examples\`
64 and 512 (8× apart) and \`--no-report\`:

| calibration examples | peak RSS | wall time |
|---|---|---|
${rows}
Machine: ${cpu}, $(nproc) cores, $(date -u +%Y-%m-%d). Most of the resident memory is
LibTorch and OpenBLAS themselves; the part that depends on \`N\` is a list of
held-out indices (8 bytes per held-out example).
MD
echo "wrote docs/compile-memory.md" >&2
