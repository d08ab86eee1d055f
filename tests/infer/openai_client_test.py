"""Python's openai client against tessel serve's OpenAI API, for char_gpt (one training step):
/v1/models; completions and chat completions, with and without stream=True, whose greedy text
is what `tessel predict` generates for the same prompt (eight streams at once, continuously
batched, each equal to its prompt's predict text); stop strings and usage counts; bad requests
(malformed JSON, unknown model, bad max_tokens, a prompt past the context, a client that leaves
mid-stream) answered in OpenAI's error shape with the server alive; the docs' client snippet;
and a SIGTERM that stops the server with exit code 0.

    openai_client_test.py TESSEL_BINARY SOURCE_DIR
"""
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

import openai

TESSEL, SRC = sys.argv[1], sys.argv[2]
CONFIG = os.path.join(SRC, "examples", "char_gpt.toml")
PROMPTS = ["Oh the moon", "And I", "The sea", "When we", "Love is", "a", "My heart", "Down by"]
NEW = 12
STEP_DELAY_MS = 5  # every generation step sleeps this long (debug.delay_ms): see check_bad_requests


def run(*args):
    subprocess.run([TESSEL, *args], check=True, capture_output=True, text=True)


def predict(tmp, run_dir, prompts, new):
    """The texts `tessel predict` generates (greedy) for the prompts."""
    src, out = os.path.join(tmp, "prompts.txt"), os.path.join(tmp, "gen.jsonl")
    with open(src, "w") as f:
        f.write("\n".join(prompts) + "\n")
    run("predict", CONFIG, "--checkpoint", run_dir, "--input", src, "--output", out, "--set",
        f"infer.max_new_tokens={new}", "--set", "infer.temperature=0")
    return [json.loads(line)["text"] for line in open(out)]


def post(port, path, body):
    """(status, JSON answer) of a raw POST."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def metric(port, name):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    return int(re.search(rf"^{name} (\d+)$", text, re.M).group(1))


def expect_openai_error(status, body, param=None, code=None):
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert err["type"] == "invalid_request_error" and err["message"], err
    assert err["param"] == param and err["code"] == code, err
    return status


def check_completions(client, expected):
    models = client.models.list()
    assert [m.id for m in models.data] == ["char_gpt"], models
    for prompt, text in zip(PROMPTS[:2], expected):
        r = client.completions.create(model="char_gpt", prompt=prompt, max_tokens=NEW,
                                      temperature=0)
        assert r.choices[0].text == text, (prompt, r.choices[0].text, text)
        assert r.choices[0].finish_reason == "length", r
        assert r.usage.prompt_tokens == len(prompt) and r.usage.completion_tokens == NEW, r.usage
        pieces = [c.choices[0].text for c in client.completions.create(
            model="char_gpt", prompt=prompt, max_tokens=NEW, temperature=0, stream=True)]
        assert "".join(pieces) == text, (pieces, text)
    # A stop string: the text ends before it.
    stop = expected[0][3:5]
    r = client.completions.create(model="char_gpt", prompt=PROMPTS[0], max_tokens=NEW,
                                  temperature=0, stop=[stop])
    assert r.choices[0].text == expected[0][:expected[0].find(stop)], r
    assert r.choices[0].finish_reason == "stop", r


def check_chat(client, port, chat_text):
    messages = [{"role": "user", "content": PROMPTS[0]}]
    r = client.chat.completions.create(model="char_gpt", messages=messages, max_tokens=NEW,
                                       temperature=0)
    assert r.choices[0].message.content == chat_text, (r, chat_text)
    assert r.choices[0].message.role == "assistant", r
    assert r.usage.prompt_tokens == len(f"user: {PROMPTS[0]}\nassistant:"), r.usage
    stream = client.chat.completions.create(model="char_gpt", messages=messages, max_tokens=NEW,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == chat_text, (text, chat_text)
    assert chunks[-1].usage.completion_tokens == NEW, chunks[-1]


def check_concurrent_streams(client, expected):
    """Eight streams at once (continuously batched): each the text of its prompt alone."""
    got = [None] * len(PROMPTS)

    def one(i):
        s = client.completions.create(model="char_gpt", prompt=PROMPTS[i], max_tokens=NEW,
                                      temperature=0, stream=True)
        got[i] = "".join(c.choices[0].text for c in s)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == expected, (got, expected)


def check_bad_requests(client, port):
    assert expect_openai_error(*post(port, "/v1/completions", b"{not json")) == 400
    try:
        client.completions.create(model="nope", prompt="a", max_tokens=3)
        raise AssertionError("an unknown model was accepted")
    except openai.NotFoundError as e:
        expect_openai_error(404, e.body if "error" in (e.body or {}) else {"error": e.body},
                            "model", "model_not_found")
    for bad in (0, -3, "x", 1.5):
        status, body = post(port, "/v1/completions", json.dumps(
            {"model": "char_gpt", "prompt": "a", "max_tokens": bad}).encode())
        assert expect_openai_error(status, body, "max_tokens") == 400, body
    status, body = post(port, "/v1/completions", json.dumps(
        {"model": "char_gpt", "prompt": "a", "max_tokens": 500}).encode())
    assert expect_openai_error(status, body, "max_tokens", "context_length_exceeded") == 400
    # A client that leaves mid-stream: the generation is cancelled. It keeps its socket until
    # the first event (the request read, its stream begun) and leaves with 59 tokens to go, which
    # take at least 59 * STEP_DELAY_MS: the time the server has to see it go. Without the delay
    # the 60 tokens take ~3 ms, and on a loaded host the generation often ended whole before an
    # I/O thread ran to see the client gone (then nothing is cancelled, rightly).
    before = metric(port, "tessel_generate_cancelled")
    with socket.create_connection(("127.0.0.1", port)) as s:
        body = json.dumps({"model": "char_gpt", "prompt": "a", "max_tokens": 60,
                           "stream": True, "temperature": 0}).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                  b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        got = b""
        while b"data: " not in got:
            piece = s.recv(4096)
            assert piece, got
            got += piece
    deadline = time.time() + 10
    while (metric(port, "tessel_generate_cancelled") != before + 1
           or metric(port, "tessel_generate_sequences") or metric(port, "tessel_generate_waiting")):
        assert time.time() < deadline, "the left generation was not cancelled within 10 s"
        time.sleep(0.05)
    assert metric(port, "tessel_kv_cache_held_bytes") == 0


def check_docs_snippet(port):
    """The OpenAI snippet of docs/inference.md, run against this server."""
    doc = open(os.path.join(SRC, "docs", "inference.md")).read()
    snippet = re.search(r"```python\n(from openai import OpenAI.*?)```", doc, re.S).group(1)
    snippet = snippet.replace("localhost:8081", f"127.0.0.1:{port}")
    out = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and out.stdout.strip(), out


def check_sigterm_under_load(client, server):
    """SIGTERM while eight streams run: each stream still ends whole ([DONE] after its
    max_tokens tokens), and the server exits 0 within 10 s."""
    started, done = threading.Semaphore(0), [None] * len(PROMPTS)

    def one(i):
        n, first = 0, True
        for c in client.completions.create(model="char_gpt", prompt=PROMPTS[i], max_tokens=40,
                                           temperature=0, stream=True):
            if first:
                started.release()
                first = False
            n += c.choices[0].text != ""
            reason = c.choices[0].finish_reason
        done[i] = (n, reason)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for _ in PROMPTS:
        started.acquire()
    server.terminate()
    t0 = time.time()
    for t in threads:
        t.join()
    out, _ = server.communicate(timeout=10)
    assert server.returncode == 0 and time.time() - t0 < 10, out
    assert done == [(40, "length")] * len(PROMPTS), done
    read, sent = map(int, re.search(r"(\d+) requests read, (\d+) answered", out).groups())
    assert read == sent, out


def main():
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = os.path.join(tmp, "char_gpt")
        run("train", CONFIG, "--quiet", "--run-dir", run_dir, "--set", "train.max_steps=1")
        expected = predict(tmp, run_dir, PROMPTS, NEW)
        server = subprocess.Popen([TESSEL, "serve", CONFIG, "--checkpoint", run_dir, "--port",
                                   "0", "--set", "serve.max_step_tokens=16", "--set",
                                   "debug.slow_rank=0", "--set", f"debug.delay_ms={STEP_DELAY_MS}"],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            port = int(re.search(r"127\.0\.0\.1:(\d+)", server.stdout.readline()).group(1))
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none",
                                   max_retries=0)
            check_completions(client, expected)
            # The chat template's prompt through the lockstep generator (/v1/predict).
            status, body = post(port, "/v1/predict", json.dumps(
                {"prompts": [f"user: {PROMPTS[0]}\nassistant:"], "max_new_tokens": NEW}).encode())
            assert status == 200, body
            check_chat(client, port, body["outputs"][0]["text"])
            check_concurrent_streams(client, expected)
            check_bad_requests(client, port)
            check_concurrent_streams(client, expected)  # the others unaffected
            check_docs_snippet(port)
            check_sigterm_under_load(client, server)
        finally:
            if server.poll() is None:
                server.kill()
    print("openai client: ok")


if __name__ == "__main__":
    main()
