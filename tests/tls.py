"""A Redis server that speaks only TLS, with certificates made for the test: Debian's redis-server.

`TlsServer` makes a CA, a server certificate for 127.0.0.1 and a client certificate with the
`openssl` command, then starts `redis-server --port 0 --tls-port P`; with `client_certs` the
server requires a certificate the CA signed from every client (mutual TLS).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from threadmill.embedded import free_port

#: Seconds a TLS server may take to answer its first PING.
START_TIMEOUT_S = 10.0


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=30)


def make_certificates(folder: Path) -> None:
    """Write ca.crt, server.crt/.key (for 127.0.0.1) and client.crt/.key into `folder`.

    With the extensions Python's strict verification (its default since 3.13) asks for: a CA
    with key usage, end certificates naming their issuer's key.
    """
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=threadmill-test-ca",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             "-keyout", "ca.key", "-out", "ca.crt", cwd=folder)  # fmt: skip
    for name, usage in (("server", "serverAuth"), ("client", "clientAuth")):
        (folder / f"{name}.ext").write_text(
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
            f"extendedKeyUsage={usage}\nsubjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n"
            "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
        )
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN=threadmill-test-{name}",
                 "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=folder)  # fmt: skip
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-days", "2", "-out", f"{name}.crt", "-extfile", f"{name}.ext", cwd=folder)  # fmt: skip


class TlsServer:
    """One TLS-only redis-server on 127.0.0.1 and the certificates a client needs."""

    def __init__(self, *, client_certs: bool) -> None:
        for tool in ("redis-server", "openssl"):
            if shutil.which(tool) is None:
                raise RuntimeError(f"The TLS tests need Debian's {tool}: run `bash .ci/bootstrap test` as root.")
        self.folder = Path(tempfile.mkdtemp(prefix="threadmill-tls-"))
        make_certificates(self.folder)
        self.port = free_port()
        self.client_certs = client_certs
        f = self.folder
        self.process = subprocess.Popen(
            ["redis-server", "--port", "0", "--tls-port", str(self.port), "--bind", "127.0.0.1",
             "--tls-cert-file", str(f / "server.crt"), "--tls-key-file", str(f / "server.key"),
             "--tls-ca-cert-file", str(f / "ca.crt"), "--tls-auth-clients", "yes" if client_certs else "no",
             "--save", "", "--appendonly", "no", "--dir", str(f)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self._wait_until_ready()

    @property
    def url(self) -> str:
        """The URL a client with this server's CA (and, for mutual TLS, the client certificate) uses."""
        query = f"ssl_ca_certs={self.folder / 'ca.crt'}"
        if self.client_certs:
            query += f"&ssl_certfile={self.folder / 'client.crt'}&ssl_keyfile={self.folder / 'client.key'}"
        return f"rediss://127.0.0.1:{self.port}/0?{query}"

    @property
    def url_without_client_certificate(self) -> str:
        return f"rediss://127.0.0.1:{self.port}/0?ssl_ca_certs={self.folder / 'ca.crt'}"

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url)

    def _wait_until_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                self.client().ping()
                return
            except redis.ConnectionError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("redis-server with TLS did not start") from None
                time.sleep(0.05)  # a start-up poll with a deadline, not a synchronisation

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)
        shutil.rmtree(self.folder, ignore_errors=True)
