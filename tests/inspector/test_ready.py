"""`/threadmill/ready`: 200 while every backend's server answers, 503 once one does not, to anyone, telling nothing."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.servers import start_server
from threadmill.embedded import free_port

URL = "/threadmill/ready"


def point_at(settings, **urls: str) -> None:
    """Make TASKS one threadmill backend per alias given, each on its REDIS_URL."""
    default = settings.TASKS["default"]
    settings.TASKS = {alias: {**default, "REDIS_URL": url, "CLUSTER": False} for alias, url in urls.items()}


def test_an_anonymous_probe_is_ready_while_the_server_answers():
    response = Client().get(URL)
    assert response.status_code == 200
    assert response.content == b"Ready.\n"
    assert "no-store" in response.headers["Cache-Control"]


def test_a_server_that_stops_answering_makes_it_not_ready_and_the_answer_names_nothing(settings):
    own = start_server("valkey")
    try:
        point_at(settings, default=own.url)
        assert Client().get(URL).status_code == 200
    finally:
        own.stop()
    response = Client().get(URL)
    assert response.status_code == 503
    assert response.content == b"Not ready: a Redis server does not answer.\n"


def test_one_backend_of_two_down_is_not_ready(settings, redis_url):
    point_at(settings, default=redis_url, other=f"redis://127.0.0.1:{free_port()}/0")
    assert Client().get(URL).status_code == 503
    point_at(settings, default=redis_url, other=redis_url)
    assert Client().get(URL).status_code == 200


@pytest.mark.parametrize("cluster", [False, True], ids=["server", "cluster"])
def test_a_refused_password_or_an_unreachable_cluster_is_a_503_without_the_password(settings, password_server, cluster):
    address = password_server.url_with(password="wrong") if not cluster else password_server.url_with(port=free_port())
    settings.TASKS = {"default": {**settings.TASKS["default"], "REDIS_URL": address, "CLUSTER": cluster}}
    response = Client().get(URL)
    assert response.status_code == 503
    assert password_server.password.encode() not in response.content
    assert b"127.0.0.1" not in response.content


def test_the_probe_takes_get_and_head_only():
    assert Client().head(URL).status_code == 200
    assert Client().post(URL).status_code == 405
