"""The Threadmill console as a Django app; templates and static files ship inside it.

It needs the `console` extra (`pip install 'threadmill[console]'`): importing it without that
raises ImproperlyConfigured naming the extra and what is missing, not a bare ImportError.
"""

from importlib.util import find_spec

#: The packages the console imports, by import name, all installed by the `console` extra.
CONSOLE_PACKAGES = ("channels", "django_htmx", "django_tables2")


def _check_console_extra() -> None:
    missing = [name for name in CONSOLE_PACKAGES if find_spec(name) is None]
    if missing:
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured(
            f"The Threadmill console (the 'inspector' app) needs the console extra: "
            f"pip install 'threadmill[console]' (missing: {', '.join(missing)})."
        )


_check_console_extra()
