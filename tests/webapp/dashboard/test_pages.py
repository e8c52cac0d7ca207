import json

import pytest

from webapp.runs.models import Run
from webapp.runs.services import create_run

pytestmark = pytest.mark.django_db


def form_data(config=None, **fields):
    data = {"name": "from the form", "mode": "decoupled",
            "config": json.dumps(config if config is not None else {})}
    return {**data, **fields}


@pytest.mark.parametrize("path", ["/", "/runs/new/", "/runs/1/"])
def test_it_sends_anonymous_visitors_to_the_login_page(client, path):
    response = client.get(path)

    assert response.status_code == 302
    assert response["Location"] == f"/accounts/login/?next={path}"


def test_the_login_page_logs_a_user_in(client, django_user_model):
    django_user_model.objects.create_user("lena", password="a long test password")

    page = client.get("/accounts/login/")
    response = client.post("/accounts/login/",
                           {"username": "lena", "password": "a long test password"})

    assert page.status_code == 200
    assert response.status_code == 302
    assert response["Location"] == "/"
    assert client.get("/").status_code == 200


def test_logout_is_a_post(viewer_client):
    response = viewer_client.post("/accounts/logout/")

    assert response.status_code == 302
    assert viewer_client.get("/").status_code == 302


def test_the_runs_page_lists_runs(viewer_client):
    create_run(name="listed run", mode="elastic", config={}, user=None)

    response = viewer_client.get("/")

    assert response.status_code == 200
    assert b"listed run" in response.content
    assert b"Elastic data-parallel" in response.content


def test_the_runs_page_offers_new_runs_only_to_operators(viewer_client, operator_client):
    assert b"/runs/new/" not in viewer_client.get("/").content
    assert b"/runs/new/" in operator_client.get("/").content


def test_viewers_get_403_on_the_new_run_page(viewer_client):
    assert viewer_client.get("/runs/new/").status_code == 403
    assert viewer_client.post("/runs/new/", form_data()).status_code == 403
    assert not Run.objects.exists()


def test_the_new_run_form_is_filled_with_the_default_config(operator_client):
    response = operator_client.get("/runs/new/")

    assert response.status_code == 200
    config = json.loads(response.context["form"]["config"].value())
    assert config["sync"]["min_quorum"] == 2
    assert b"min_quorum" in response.content


def test_the_new_run_form_creates_a_run_and_shows_it(operator_client, operator):
    response = operator_client.post("/runs/new/", form_data({"sync": {"min_quorum": 1}}))

    run = Run.objects.get()
    assert response.status_code == 302
    assert response["Location"] == f"/runs/{run.pk}/"
    assert (run.name, run.created_by, run.config["sync"]["min_quorum"]) == (
        "from the form", operator, 1)


def test_the_new_run_form_lists_config_errors_by_dotted_path_under_config(operator_client):
    config = {"sync": {"min_quorum": 5}, "model": {"n_head": 5}}

    response = operator_client.post("/runs/new/", form_data(config))

    assert response.status_code == 200
    errors = response.context["form"].errors
    assert errors["config"] == [
        "model.n_head: Must divide model.n_embd (64), got 5.",
        "sync.min_quorum: Must be between 1 and the number of islands (2), got 5.",
    ]
    assert b"sync.min_quorum: Must be between 1" in response.content
    assert not Run.objects.exists()


def test_the_new_run_form_shows_name_and_mode_errors_on_their_own_fields(operator_client):
    response = operator_client.post("/runs/new/", form_data(name="", mode="synchronous"))

    errors = response.context["form"].errors
    assert errors["name"] == ["This field is required."]
    assert "synchronous" in errors["mode"][0]
    assert "config" not in errors


def test_the_new_run_form_rejects_config_that_is_not_json(operator_client):
    response = operator_client.post("/runs/new/", {"name": "r", "mode": "decoupled",
                                                   "config": "{sync: 1}"})

    assert response.context["form"].errors["config"][0].startswith("Not valid JSON")
    assert not Run.objects.exists()


def test_the_run_page_shows_state_mode_and_islands(viewer_client):
    run = create_run(name="shown", mode="decoupled",
                     config={"islands": [{"name": "iceland", "region": "us-west"}],
                             "sync": {"min_quorum": 1}}, user=None)

    response = viewer_client.get(f"/runs/{run.pk}/")

    assert response.status_code == 200
    content = response.content.decode()
    assert "Decoupled DiLoCo" in content
    assert "draft" in content
    assert "iceland" in content and "us-west" in content


def test_the_run_page_answers_404_for_a_missing_run(viewer_client):
    assert viewer_client.get("/runs/999999/").status_code == 404


def test_the_admin_never_shows_the_run_secret(client, django_user_model):
    admin = django_user_model.objects.create_superuser("root", "root@example.com", None)
    client.force_login(admin)
    run = create_run(name="guarded", mode="decoupled", config={}, user=None)

    change_page = client.get(f"/admin/runs/run/{run.pk}/change/")
    list_page = client.get("/admin/runs/run/")

    assert change_page.status_code == 200 and list_page.status_code == 200
    assert b"guarded" in list_page.content
    assert run.secret.encode() not in change_page.content
    assert run.secret.encode() not in list_page.content


def test_superusers_may_create_runs(client, django_user_model):
    client.force_login(django_user_model.objects.create_superuser("root", None, None))

    assert client.get("/runs/new/").status_code == 200
