"""A client of the running admission webhook over HTTPS, trusting the test CA."""

from __future__ import annotations

import json
import ssl
from collections.abc import Mapping
from http.client import HTTPSConnection
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from nri_midbatch.tools.webhook.server import WebhookServer
from tests.tls import Tls


class Client:
    def __init__(self, server: WebhookServer, tls: Tls) -> None:
        self.port = server.port
        self.context = tls.client()

    def raw(
        self, method: str, path: str, body: bytes | None = None, headers: Mapping[str, str] = {}
    ) -> tuple[int, str, bytes]:
        connection = HTTPSConnection("127.0.0.1", self.port, context=self.context, timeout=10)
        try:
            connection.request(method, path, body, dict(headers))
            reply = connection.getresponse()
            return reply.status, reply.getheader("Content-Type") or "", reply.read()
        finally:
            connection.close()

    def post(self, path: str, document: Any) -> tuple[int, Any]:
        body = document if isinstance(document, bytes) else json.dumps(document).encode()
        status, content_type, data = self.raw(
            "POST", path, body, {"Content-Type": "application/json"}
        )
        assert content_type == "application/json", (status, data)
        return status, json.loads(data)

    def admit(self, path: str, document: Mapping[str, Any]) -> dict[str, Any]:
        status, reply = self.post(path, document)
        assert status == 200, reply
        assert reply["apiVersion"] == "admission.k8s.io/v1"
        assert reply["kind"] == "AdmissionReview"
        assert reply["response"]["uid"] == document["request"]["uid"]
        return reply  # type: ignore[no-any-return]


def read_reply(sock: ssl.SSLSocket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(rest) < length:
        rest += sock.recv(65536)
    return head + b"\r\n\r\n" + rest


def scrape(client: Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, content_type, body = client.raw("GET", "/metrics")
    assert status == 200
    assert content_type.startswith("text/plain; version=0.0.4")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
    }
