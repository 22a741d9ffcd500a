"""The demo site's static-file handler: Django's, with a path outside the static directories as a 404."""

from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.exceptions import SuspiciousFileOperation
from django.http import Http404


class StaticFilesHandler(ASGIStaticFilesHandler):
    """Serve the console's static files; a path that climbs out of them (`%2e%2e/`) is a plain 404."""

    def serve(self, request):
        try:
            return super().serve(request)
        except SuspiciousFileOperation as e:
            # Django's handler turns only Http404 into a response; this one escaped as a 500.
            raise Http404("No such static file.") from e
