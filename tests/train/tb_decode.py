# Independent check of tessel's TensorBoard event files: reads the TFRecord framing with its own
# CRC-32C, decodes every record with the Python classes that protoc generates from TensorBoard's
# own schema (PROTO_DIR: third_party/tensorboard_proto, the files TensorBoard reads events with;
# python3-protobuf), and checks that the scalars are exactly metrics.jsonl's numbers (as
# float32), tag "<type>/<key>" at the record's step. Usage: tb_decode.py RUN_DIR PROTO_DIR.
# Exit 0 and "ok ..." when they match.
import glob
import importlib
import json
import os
import struct
import subprocess
import sys
import tempfile


def crc32c_table():
    table = []
    for b in range(256):
        c = b
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
        table.append(c)
    return table


TABLE = crc32c_table()


def masked_crc(data):
    c = 0xFFFFFFFF
    for byte in data:
        c = TABLE[(c ^ byte) & 0xFF] ^ (c >> 8)
    c ^= 0xFFFFFFFF
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def records(path):
    with open(path, "rb") as f:
        data = f.read()
    at = 0
    while at < len(data):
        header = data[at:at + 8]
        (length,) = struct.unpack("<Q", header)
        (crc,) = struct.unpack("<I", data[at + 8:at + 12])
        if crc != masked_crc(header):
            sys.exit("FAIL: length CRC at byte %d" % at)
        body = data[at + 12:at + 12 + length]
        (crc,) = struct.unpack("<I", data[at + 12 + length:at + 16 + length])
        if len(body) != length or crc != masked_crc(body):
            sys.exit("FAIL: data CRC at byte %d" % at)
        yield body
        at += 16 + length


def main():
    run_dir, proto_dir = sys.argv[1], sys.argv[2]
    out = tempfile.mkdtemp()
    protos = sorted(glob.glob(os.path.join(proto_dir, "tensorboard", "compat", "proto", "*.proto")))
    subprocess.run(["protoc", "-I", proto_dir, "--python_out", out] + protos, check=True)
    sys.path.insert(0, out)
    pb = importlib.import_module("tensorboard.compat.proto.event_pb2")
    files = glob.glob(os.path.join(run_dir, "tensorboard", "events.out.tfevents.*"))
    if len(files) != 1:
        sys.exit("FAIL: expected one event file, got %s" % files)
    got, version = {}, None
    for body in records(files[0]):
        event = pb.Event()
        event.ParseFromString(body)
        if event.WhichOneof("what") == "file_version":
            version = event.file_version
            continue
        for v in event.summary.value:
            got[(v.tag, event.step)] = v.simple_value
    if version != "brain.Event:2":
        sys.exit("FAIL: file_version %r" % version)
    want = {}
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            for k, v in r.items():
                if k not in ("step", "epoch", "type") and isinstance(v, (int, float)) \
                        and not isinstance(v, bool):
                    want[(r["type"] + "/" + k, r["step"])] = struct.unpack("<f", struct.pack("<f", v))[0]
    if got != want:
        missing = sorted(set(want) - set(got))[:5]
        extra = sorted(set(got) - set(want))[:5]
        wrong = [(k, got[k], want[k]) for k in want if k in got and got[k] != want[k]][:5]
        sys.exit("FAIL: missing %s extra %s wrong %s" % (missing, extra, wrong))
    print("ok %d scalars in %d tags" % (len(got), len({k[0] for k in got})))


main()
