"""The demo site's ASGI application: static files, served by the site itself, driven through asgiref's communicator."""

from __future__ import annotations

import time

import pytest
from asgiref.testing import ApplicationCommunicator

pytestmark = pytest.mark.django_db


async def _get(path: str) -> dict:
    """Send one GET to the site's ASGI application; return its status and whole body."""
    from inspector.site.asgi import application

    scope = {"type": "http", "http_version": "1.1", "method": "GET", "path": path, "raw_path": path.encode(),
             "query_string": b"", "headers": [(b"host", b"127.0.0.1")], "scheme": "http",
             "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 5000)}  # fmt: skip
    communicator = ApplicationCommunicator(application, scope)
    await communicator.send_input({"type": "http.request", "body": b""})
    start = await communicator.receive_output(10)
    body = b""
    while True:
        chunk = await communicator.receive_output(10)
        body += chunk.get("body", b"")
        if not chunk.get("more_body"):
            break
    await communicator.wait()
    return {"status": start["status"], "body": body}


async def test_a_static_file_of_the_console_is_served():
    response = await _get("/static/inspector/console.js")
    assert response["status"] == 200
    assert response["body"].startswith(b"// Threadmill console")


@pytest.mark.parametrize(
    "path",
    [
        "/static/inspector/../../manage.py",  # what `%2e%2e/%2e%2e/manage.py` decodes to
        "/static/../inspector/site/settings.py",
        "/static//etc/passwd",
        "/static/inspector/no-such-file.js",
    ],
)
async def test_a_static_path_outside_the_static_files_is_a_quick_404(path):
    started = time.monotonic()
    response = await _get(path)
    assert response["status"] == 404
    assert b"SECRET_KEY" not in response["body"] and b"import" not in response["body"]
    assert time.monotonic() - started < 5  # it was a 500 after about a second; a 404 is immediate
