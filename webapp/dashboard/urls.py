from django.urls import path

from webapp.dashboard import views

app_name = "dashboard"
urlpatterns = [
    path("", views.runs, name="runs"),
    path("runs/new/", views.new_run, name="new_run"),
    path("runs/<int:run_id>/", views.run_detail, name="run"),
    path("compare/", views.compare, name="compare"),
    path("simulate/", views.simulate, name="simulate"),
    path("reports/<str:name>/", views.benchmark_report, name="report"),
    path("account/tokens/", views.tokens, name="tokens"),
    path("account/tokens/<int:token_id>/revoke/", views.revoke_token, name="revoke_token"),
]
