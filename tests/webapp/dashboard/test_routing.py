"""The dashboard's websocket routes (webapp.dashboard.routing): each path to its
consumer, with its ids."""

import pytest

from webapp.dashboard.consumers import RunsListConsumer, RunStatusConsumer, SimulationConsumer
from webapp.dashboard.routing import websocket_urlpatterns


@pytest.mark.parametrize("path, consumer, kwargs", [
    ("ws/runs/", RunsListConsumer, {}),
    ("ws/runs/12/", RunStatusConsumer, {"run_id": 12}),
    ("ws/simulations/3/", SimulationConsumer, {"simulation_id": 3}),
])
def test_each_websocket_path_goes_to_its_consumer_with_its_ids(path, consumer, kwargs):
    [match] = [(route, route.pattern.match(path)) for route in websocket_urlpatterns
               if route.pattern.match(path)]
    route, (_, _, found) = match

    assert route.callback.consumer_class is consumer
    assert found == kwargs


def test_a_run_id_must_be_a_number():
    assert not [route for route in websocket_urlpatterns if route.pattern.match("ws/runs/x/")]

