"""The console's 503 page and the metrics' 503 never show the password of REDIS_URL."""

from __future__ import annotations

import pytest

from threadmill.embedded import free_port


@pytest.mark.parametrize("cluster", [False, True], ids=["server", "cluster"])
@pytest.mark.parametrize("url", ["/threadmill/", "/threadmill/default/default/ready/", "/threadmill/metrics"])
def test_an_unreachable_server_s_503_shows_no_password(operator_client, settings, password_server, cluster, url):
    address = password_server.url_with(port=free_port())
    settings.TASKS = {"default": {**settings.TASKS["default"], "REDIS_URL": address, "CLUSTER": cluster}}
    response = operator_client.get(url)
    assert response.status_code == 503
    assert "Cannot reach the Redis" in response.content.decode()
    assert password_server.password not in response.content.decode()


def test_the_console_works_on_a_server_with_a_password_and_shows_no_password(
    operator_client, settings, password_server
):
    settings.TASKS = {"default": {**settings.TASKS["default"], "REDIS_URL": password_server.url}}
    response = operator_client.get("/threadmill/")
    assert response.status_code == 200
    assert password_server.password not in response.content.decode()


@pytest.mark.parametrize("url", ["/threadmill/", "/threadmill/default/default/ready/", "/threadmill/metrics"])
def test_a_redis_url_redis_py_cannot_read_is_a_503_naming_it_without_the_password(
    operator_client, settings, password_server, url
):
    before, after = "pw" + "1f3a9c2e", "77b1d0e4"  # an unencoded "?" in the password
    address = f"redis://deploy:{before}?{after}@127.0.0.1:{password_server.port}/0"
    settings.TASKS = {"default": {**settings.TASKS["default"], "REDIS_URL": address}}
    response = operator_client.get(url)
    assert response.status_code == 503
    assert "cannot be read: its port is not a number" in response.content.decode()
    assert before not in response.content.decode() and after not in response.content.decode()
