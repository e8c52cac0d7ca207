"""Websocket routes of the dashboard; the live run consumers will be added here."""

from django.urls import URLPattern

websocket_urlpatterns: list[URLPattern] = []
