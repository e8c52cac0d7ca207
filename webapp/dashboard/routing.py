"""Websocket routes of the dashboard."""

from django.urls import path

from webapp.dashboard.consumers import RunsListConsumer, RunStatusConsumer, SimulationConsumer

websocket_urlpatterns = [
    path("ws/runs/", RunsListConsumer.as_asgi()),
    path("ws/runs/<int:run_id>/", RunStatusConsumer.as_asgi()),
    path("ws/simulations/<int:simulation_id>/", SimulationConsumer.as_asgi()),
]
