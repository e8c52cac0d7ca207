"""Celery tasks of the web app, on the control queue: thin glue around services."""

from celery import shared_task

from webapp.runs.simulations import run_simulation_now


@shared_task(name="runs.run_simulation")
def run_simulation(simulation_id: int) -> None:
    run_simulation_now(simulation_id)
