"""The console's websocket route; add it to the site's ASGI `websocket` router."""

from django.urls import path

from .consumers import ConsoleConsumer

websocket_urlpatterns = [
    path("threadmill/ws/", ConsoleConsumer.as_asgi()),
]
