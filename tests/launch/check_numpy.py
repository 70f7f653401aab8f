#!/usr/bin/env python3
"""tests/launch/check_numpy.py: what numpy sees of a pss checkpoint.

usage: check_numpy.py PSS_CKPT DIR    (DIR: a CheckpointManager's directory, as launch.checkpoint leaves it)

Loads every shard and slot file with numpy.load, reassembles each variable from index.json, checks every
file's size and zlib.crc32 against the index, and compares the values with what `pss-ckpt show` prints.
Then flips one byte of a copy and checks that `pss-ckpt verify` fails naming that file. Exits 77 (skipped)
when numpy is not installed (Debian: python3-numpy; tools/test.sh installs it).
"""
import ast
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zlib

try:
    import numpy as np
except ImportError:
    # Debian's python3-numpy is for Debian's python3; the python3 first on PATH may be another (pyenv).
    system_python = "/usr/bin/python3"
    if os.path.realpath(sys.executable) != os.path.realpath(system_python) and os.path.exists(system_python):
        os.execv(system_python, [system_python] + sys.argv)
    print("numpy is not installed (apt-get install python3-numpy): skipped")
    sys.exit(77)

ckpt_tool, manager_dir = sys.argv[1], sys.argv[2]
latest = json.load(open(os.path.join(manager_dir, "latest")))["latest"]
ckpt = os.path.join(manager_dir, latest)
index = json.load(open(os.path.join(ckpt, "index.json")))
assert index["format"] == "pss-checkpoint" and index["format_version"] == 1, index["format_version"]
numpy_dtype = {"float32": np.float32, "float64": np.float64, "int32": np.int32, "int64": np.int64, "string": np.bytes_}


def check_file(record):
    data = open(os.path.join(ckpt, record["file"]), "rb").read()
    assert len(data) == record["bytes"], (record["file"], len(data), record["bytes"])
    assert zlib.crc32(data) == record["crc32"], (record["file"], zlib.crc32(data), record["crc32"])


def pss_ckpt_show(name, slot=None):
    """The values `pss-ckpt show` prints, as a numpy array of the variable's shape."""
    args = [ckpt_tool, "show", ckpt, name] + (["--slot", slot] if slot else [])
    lines = subprocess.run(args, check=True, capture_output=True, text=True).stdout.splitlines()
    return [line.split() for line in lines[1:]]


files = 0
for var in index["variables"]:
    dtype = numpy_dtype[var["dtype"]]
    parts, slot_parts = [], {}
    for shard in var["shards"]:
        check_file(shard["value"])
        files += 1
        part = np.load(os.path.join(ckpt, shard["value"]["file"]))
        # A string shard is numpy's fixed-width bytes (|S<its longest element>).
        same_dtype = part.dtype.kind == "S" if var["dtype"] == "string" else part.dtype == dtype
        assert same_dtype and list(part.shape) == shard["shape"], (shard["value"]["file"], part.dtype, part.shape)
        parts.append(part)
        for slot, record in shard["slots"].items():
            check_file(record)
            files += 1
            slot_parts.setdefault(slot, []).append(np.load(os.path.join(ckpt, record["file"])))
    whole = np.concatenate(parts) if var["shape"] else parts[0]
    assert list(whole.shape) == var["shape"], (var["name"], whole.shape)
    shown = pss_ckpt_show(var["name"])
    if var["dtype"] == "string":  # pss-ckpt shows Python's bytes literals: b'the'
        shown = [[ast.literal_eval(word) for word in row] for row in shown]
    shown = np.array(shown, dtype=dtype).reshape(whole.shape)
    assert np.array_equal(shown, whole), (var["name"], shown, whole)
    for slot, pieces in slot_parts.items():
        slot_whole = np.concatenate(pieces) if var["shape"] else pieces[0]
        shown = np.array(pss_ckpt_show(var["name"], slot), dtype=dtype).reshape(slot_whole.shape)
        assert np.array_equal(shown, slot_whole), (var["name"], slot)
    print(f"{var['name']}: {whole.dtype} {whole.shape} from {len(parts)} shards, slots {sorted(slot_parts)}: "
          "numpy and pss-ckpt show agree")

# Adam's velocity is a square's running mean: never negative; its momentum is not all zero after training.
emb = next(v for v in index["variables"] if v["name"] == "embedding/embeddings")
velocity = np.load(os.path.join(ckpt, emb["shards"][1]["slots"]["velocity"]["file"]))
assert velocity.shape == (6, 4) and velocity.dtype == np.float32 and (velocity >= 0).all() and velocity.any()
# The vocabulary as the three steps left it: rows 0 to 2 replaced.
vocabulary = next(v for v in index["variables"] if v["name"] == "vocabulary")
words = np.concatenate([np.load(os.path.join(ckpt, s["value"]["file"])) for s in vocabulary["shards"]])
assert words.tolist() == [b"word0", b"word1", b"word2", b"to", b"in", b"is"], words

# A flipped byte: pss-ckpt verify fails and names the file.
with tempfile.TemporaryDirectory() as scratch:
    copy = os.path.join(scratch, "ckpt")
    shutil.copytree(ckpt, copy)
    victim = os.path.join(copy, emb["shards"][0]["value"]["file"])
    data = bytearray(open(victim, "rb").read())
    data[-1] ^= 0x01
    open(victim, "wb").write(bytes(data))
    result = subprocess.run([ckpt_tool, "verify", copy], capture_output=True, text=True)
    assert result.returncode == 1, result
    assert f"FAILED {emb['shards'][0]['value']['file']}: {victim}: CRC-32 is" in result.stdout, result.stdout
print(f"{files} files: sizes and zlib.crc32 match index.json; a flipped byte fails pss-ckpt verify")
