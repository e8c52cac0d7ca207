"""The ASGI entry point: Django for HTTP, Channels for websockets."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
# Set Django up before importing anything that touches models (channels.auth does).
django_application = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from webapp.dashboard.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter({
    # Daphne serves the few static files itself (the pages' scripts and plotly.js);
    # a deployment may put a CDN or a web server in front of /static/ instead.
    "http": ASGIStaticFilesHandler(django_application),
    "websocket": AllowedHostsOriginValidator(
        AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
})
