"""Websocket routes of the dashboard."""

from django.urls import path

from webapp.dashboard.consumers import RunStatusConsumer

websocket_urlpatterns = [
    path("ws/runs/<int:run_id>/", RunStatusConsumer.as_asgi()),
]
