"""`/threadmill/metrics`: Prometheus scrapes, for a staff session or a bearer token; anything else is a 403.

The token is the Django setting `THREADMILL_METRICS_TOKEN`, compared in constant time; with
no token set only a staff session may scrape.
"""

from __future__ import annotations

import hmac

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpResponse, HttpResponseForbidden
from django.views.decorators.http import require_GET

from threadmill.api import metrics as api_metrics
from threadmill.exceptions import BackendConnectionError, LayoutVersionError
from threadmill.redaction import redact_text

from .security import error_status


def _bearer_ok(request) -> bool:
    token = getattr(settings, "THREADMILL_METRICS_TOKEN", "") or ""
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if not token or scheme.lower() != "bearer" or not given:
        return False
    return hmac.compare_digest(given.strip().encode(), str(token).encode())


def _staff(request) -> bool:
    user = request.user
    return user.is_authenticated and user.is_active and user.is_staff


@require_GET
def metrics(request):
    if not (_staff(request) or _bearer_ok(request)):
        return HttpResponseForbidden(
            "Metrics need a staff session or the metrics bearer token.\n", content_type="text/plain"
        )
    try:
        body = api_metrics.exposition()
    except BackendConnectionError as e:
        status, title = error_status(e)
        return HttpResponse(f"{title}: {redact_text(str(e))}\n", status=status, content_type="text/plain")
    except (LayoutVersionError, ImproperlyConfigured) as e:
        return HttpResponse(f"{redact_text(str(e))}\n", status=503, content_type="text/plain")
    return HttpResponse(body, content_type=api_metrics.CONTENT_TYPE_LATEST)
