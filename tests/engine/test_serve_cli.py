"""`venusrl serve` as a user starts it: a real process, a real port, an API key."""

import subprocess
import sys
import time
from pathlib import Path

import httpx
from tests.ports import free_port


def test_serve_process_answers_and_logs(tiny_model_dir, tmp_path):
    port = free_port()
    script = Path(sys.executable).parent / "venusrl"
    log = (tmp_path / "serve.log").open("w")
    process = subprocess.Popen(
        [str(script), "serve", "--model", str(tiny_model_dir), "--port", str(port), "--api-key", "k",
         "engine.kv_capacity_tokens=2048"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        response = httpx.post(f"{base}/v1/chat/completions", headers={"Authorization": "Bearer k"}, timeout=60,
                              json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert response.status_code == 200, response.text
        assert httpx.get(f"{base}/stats").status_code == 401  # behind the API key
        stats = httpx.get(f"{base}/stats", headers={"Authorization": "Bearer k"}).json()
        assert stats["kv_capacity_tokens"] == 2048
        assert httpx.get(f"{base}/v1/models").status_code == 401
    finally:
        process.terminate()
        process.wait(timeout=30)
    text = (tmp_path / "serve.log").read_text()
    assert "serving" in text and "prompt tokens" in text


def test_serve_rejects_a_bad_override(tiny_model_dir):
    script = Path(sys.executable).parent / "venusrl"
    out = subprocess.run([str(script), "serve", "--model", str(tiny_model_dir), "engine.page_size=zero"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "engine.page_size" in out.stderr
