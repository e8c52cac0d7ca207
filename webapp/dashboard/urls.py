from django.urls import path

from webapp.dashboard import views

app_name = "dashboard"
urlpatterns = [
    path("", views.runs, name="runs"),
    path("runs/new/", views.new_run, name="new_run"),
    path("runs/<int:run_id>/", views.run_detail, name="run"),
]
