from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from webapp.api import prometheus
from webapp.api import views as api_views
from webapp.api.api import api
from webapp.dashboard.login import RateLimitedAdminAuthenticationForm, RateLimitedLoginView

admin.site.login_form = RateLimitedAdminAuthenticationForm

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/login/", RateLimitedLoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("api/", api.urls),
    path("api/<path:rest>", api_views.not_found),
    path("metrics", prometheus.metrics, name="metrics"),
    path("", include("webapp.dashboard.urls")),
]
