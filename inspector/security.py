"""Access and browser policy for every console view: staff-only, the change permission, a strict CSP."""

from __future__ import annotations

from functools import wraps

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import BadRequest, ImproperlyConfigured, PermissionDenied
from django.http import Http404
from django.shortcuts import render
from django.utils.csp import CSP, build_policy

from threadmill.exceptions import BackendConnectionError, LayoutVersionError, ServerOutOfMemory, ServerUnreachable
from threadmill.redaction import redact_text

#: The console's Content-Security-Policy: no inline script or style, nothing from elsewhere.
CONSOLE_CSP: dict[str, list[str]] = {
    "default-src": [CSP.SELF],
    "script-src": [CSP.SELF],
    "style-src": [CSP.SELF],
    "img-src": [CSP.SELF, "data:"],
    "connect-src": [CSP.SELF],
    "object-src": [CSP.NONE],
    "base-uri": [CSP.NONE],
    "form-action": [CSP.SELF],
    "frame-ancestors": [CSP.NONE],
}

#: The permission a staff user needs to requeue, delete or purge; without it the console is read-only.
CHANGE_PERMISSION = "inspector.change_queue"


def can_change(user) -> bool:
    """Return whether the user may run console actions."""
    return user.is_active and user.is_staff and user.has_perm(CHANGE_PERMISSION)


def console_view(view):
    """Make a view staff-only (anonymous users go to the login page) and send the console CSP."""

    @wraps(view)
    def wrapper(request, *args, **kwargs):
        user = request.user
        if not user.is_authenticated:
            return redirect_to_login(request.get_full_path(), settings.LOGIN_URL)
        try:
            if not (user.is_active and user.is_staff):
                raise PermissionDenied("The Threadmill console is for staff users.")
            response = view(request, *args, **kwargs)
        except (
            Http404,
            PermissionDenied,
            BadRequest,
            BackendConnectionError,
            LayoutVersionError,
            ImproperlyConfigured,
        ) as e:
            response = error_page(request, e)
        response.headers[str(CSP.HEADER_ENFORCE)] = build_policy(CONSOLE_CSP)
        return response

    return wrapper


def change_required(view):
    """Refuse (403) a console action to a user without the change permission."""

    @wraps(view)
    def wrapper(request, *args, **kwargs):
        if not can_change(request.user):
            raise PermissionDenied("You may look at the queues but not change them.")
        return view(request, *args, **kwargs)

    return wrapper


_STATUS = {
    Http404: (404, "Not found"),
    PermissionDenied: (403, "Forbidden"),
    BadRequest: (400, "Bad request"),
    LayoutVersionError: (503, "Unknown data layout"),
    ImproperlyConfigured: (503, "Misconfigured"),
    ServerUnreachable: (503, "Redis is unreachable"),
    ServerOutOfMemory: (503, "Redis is full"),
}

#: Any other refusal by the server (a BackendConnectionError): it answered, so it is not "unreachable".
_REFUSED = (503, "Redis refused the request")


def error_status(error: Exception) -> tuple[int, str]:
    """Return the HTTP status and the page title that name what kind of error `error` is."""
    return next((pair for kind, pair in _STATUS.items() if isinstance(error, kind)), _REFUSED)


def error_page(request, error: Exception):
    """Render a console error page naming the reason: 400, 403, 404, or 503 when Redis is unreachable, full, refusing or misconfigured, or its data's layout unknown."""
    status, title = error_status(error)
    context = {"status": status, "title": title, "reason": redact_text(str(error)) or title}
    return render(request, "inspector/error.html", context, status=status)
