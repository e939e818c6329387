"""Locust load profile for `tandem serve` (OpenAI completions, chat and /predict).

    pip install locust
    locust -f bench/locustfile.py --host http://127.0.0.1:8000 --headless -u 32 -r 8 -t 60s
Set TANDEM_API_KEY when the server has keys. Sampled requests (temperature 0.8) bypass the greedy cache;
one task in five is greedy to exercise it.
"""

from __future__ import annotations

import os
import random

from locust import HttpUser, between, task

HEADERS = (
    {"Authorization": f"Bearer {os.environ['TANDEM_API_KEY']}"} if os.environ.get("TANDEM_API_KEY") else {}
)


class TandemUser(HttpUser):
    wait_time = between(0.0, 0.1)

    @task(3)
    def completion(self) -> None:
        body = {
            "prompt": f"{random.randint(0, 99)}+{random.randint(0, 99)}=",
            "max_tokens": 16,
            "temperature": 0.8,
        }
        self.client.post("/v1/completions", json=body, headers=HEADERS, name="/v1/completions")

    @task(1)
    def chat(self) -> None:
        body = {"messages": [{"role": "user", "content": "2+2="}], "max_tokens": 16, "temperature": 0.8}
        self.client.post("/v1/chat/completions", json=body, headers=HEADERS, name="/v1/chat/completions")

    @task(1)
    def greedy_predict(self) -> None:
        self.client.post("/predict", json={"text": "1+1="}, headers=HEADERS, name="/predict")
