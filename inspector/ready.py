"""`/threadmill/ready`: a readiness check for a load balancer or Kubernetes, open to anyone.

200 when every threadmill backend's server answers a PING, 503 otherwise. Neither body holds
anything from the server or the settings (no address, no alias, no error text), so an anonymous
caller learns only whether this process can serve the console.
"""

from __future__ import annotations

from django.http import HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from threadmill import api


@require_safe
@never_cache
def ready(request) -> HttpResponse:
    if api.unreachable_backends():
        return HttpResponse("Not ready: a Redis server does not answer.\n", status=503, content_type="text/plain")
    return HttpResponse("Ready.\n", content_type="text/plain")
