"""The ASGI entry point (webapp.asgi): Django for HTTP, Channels for websockets."""

from django.urls import resolve

from webapp.asgi import application


def test_the_asgi_application_serves_http_and_websockets():
    assert set(application.application_mapping) == {"http", "websocket"}
    assert resolve("/runs/new/").url_name == "new_run"  # the http side is Django's
