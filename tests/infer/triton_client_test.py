"""tritonclient[http] against tessel serve, for fashion_mlp and fashion_cnn (a few training
steps each): server and model health, the model's metadata, predictions whose records are the
bytes `tessel predict` writes for the same rows (tensors as JSON, as binary data, the client's
default, and a mix), errors raised with the server's message, and
a SIGTERM that stops the server with exit code 0 after answering every request it read.

    triton_client_test.py TESSEL_BINARY SOURCE_DIR
"""
import gzip
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

TESSEL, SRC = sys.argv[1], sys.argv[2]
IMAGES = "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz"
ROWS = 12


def run(*args):
    subprocess.run([TESSEL, *args], check=True, capture_output=True, text=True)


def write_npy(path, x):
    np.save(path, x.astype("<f4"))


def expect_error(call, needle):
    try:
        call()
    except InferenceServerException as e:
        assert needle in str(e), f"expected '{needle}' in: {e}"
        return
    raise AssertionError(f"no error, expected '{needle}'")


def check_model(tmp, model):
    config = os.path.join(SRC, "examples", model + ".toml")
    run_dir = os.path.join(tmp, model)
    run("train", config, "--quiet", "--run-dir", run_dir, "--set", "train.max_steps=1")
    server = subprocess.Popen([TESSEL, "serve", config, "--checkpoint", run_dir, "--port", "0",
                               "--workers", "2"], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        port = int(re.search(r"127\.0\.0\.1:(\d+)", server.stdout.readline()).group(1))
        client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
        assert client.is_server_live() and client.is_server_ready()
        assert client.is_model_ready(model)
        assert "binary_tensor_data" in client.get_server_metadata()["extensions"]
        meta = client.get_model_metadata(model)
        assert meta["name"] == model, meta
        (inp,) = meta["inputs"]
        assert inp["datatype"] == "FP32" and inp["shape"][0] == -1, meta
        names = [o["name"] for o in meta["outputs"]]
        assert names == ["class", "top_k_class", "top_k_prob"], meta
        # The same float32 rows through tessel predict (a .npy file) and the client.
        with gzip.open(IMAGES) as f:
            pixels = np.frombuffer(f.read(16 + ROWS * 784)[16:], np.uint8)
        x = pixels.astype(np.float32)  # raw: the server normalises as training did
        x = x.reshape([ROWS] + inp["shape"][1:])
        rows_npy, pred = os.path.join(tmp, model + ".npy"), os.path.join(tmp, model + ".jsonl")
        write_npy(rows_npy, x)
        run("predict", config, "--checkpoint", run_dir, "--input", rows_npy, "--output", pred)
        with open(pred) as f:
            want = f.read().splitlines()
        got = []
        # Requests of 5, 5 and 2 rows: JSON tensors; the client's defaults (the input and, as
        # no outputs are named, every output as binary data); a binary input, JSON outputs.
        for first, binary in [(0, None), (5, True), (10, False)]:
            part = x[first:first + 5]
            tensor = httpclient.InferInput("input", list(part.shape), "FP32")
            tensor.set_data_from_numpy(part, binary_data=binary is not None)
            outs = None if binary else [httpclient.InferRequestedOutput(n, binary_data=False)
                                        for n in names]
            res = client.infer(model, [tensor], outputs=outs, request_id=f"r{first}")
            assert res.get_response()["id"] == f"r{first}"
            cls, tk_class, tk_prob = (res.as_numpy(n) for n in names)
            for i in range(len(part)):
                got.append(json.dumps(
                    {"row": first + i, "class": int(cls[i]),
                     "top_k": [{"class": int(c), "prob": float(p)}
                               for c, p in zip(tk_class[i], tk_prob[i])]},
                    separators=(",", ":")))
        assert got == want, "\n".join(["tritonclient:"] + got + ["tessel predict:"] + want)
        print(f"{model}: metadata {inp}, {ROWS} rows equal to tessel predict's bytes")
        # Errors come back as the client's exception with the server's message.
        bad = httpclient.InferInput("input", [1, 3], "FP32")
        bad.set_data_from_numpy(np.zeros((1, 3), np.float32), binary_data=False)
        expect_error(lambda: client.infer(model, [bad]), "has shape [1,3]")
        expect_error(lambda: client.get_model_metadata("nope"), "unknown model")
        bad.set_data_from_numpy(np.zeros((1, 3), np.float32))  # as binary data
        expect_error(lambda: client.infer(model, [bad]), "has shape [1,3]")
        expect_error(lambda: client.infer("nope", [tensor]), "unknown model")
    finally:
        server.terminate()
        out, _ = server.communicate(timeout=10)
    assert server.returncode == 0, out
    read, answered = re.search(r"stopped; (\d+) requests read, (\d+) answered", out).groups()
    assert read == answered, out


def main():
    with tempfile.TemporaryDirectory() as tmp:
        for model in ["fashion_mlp", "fashion_cnn"]:
            check_model(tmp, model)
    print("tritonclient: all checks passed")


if __name__ == "__main__":
    main()
