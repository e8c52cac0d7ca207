from django.urls import path

from webapp.api import views

app_name = "api"
urlpatterns = [
    path("runs/", views.runs, name="runs"),
    path("runs/<int:run_id>/", views.run_detail, name="run"),
    path("config/schema/", views.config_schema, name="config_schema"),
]
