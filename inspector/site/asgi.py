"""ASGI entry point of the Threadmill site: HTTP through Django, the console's websocket through Channels."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "inspector.site.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # (imported once the apps are loaded)
from channels.routing import ProtocolTypeRouter, URLRouter
from channels.security.websocket import AllowedHostsOriginValidator

from inspector.routing import websocket_urlpatterns
from inspector.site.static import StaticFilesHandler

application = ProtocolTypeRouter(
    {
        # The demo site serves the console's few static files itself; a production site
        # would put them behind its web server or WhiteNoise instead.
        "http": StaticFilesHandler(django_asgi_app),
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
