"""The Threadmill console as a Django app; templates and static files ship inside it."""

from pathlib import Path

from django.apps import AppConfig

#: Where templates and static files live: the repository root in a checkout, `inspector/_*` when installed.
_REPO_ROOT = Path(__file__).resolve().parent.parent


def _first_existing(*candidates: Path) -> Path:
    return next((path for path in candidates if path.is_dir()), candidates[0])


TEMPLATES_DIR = _first_existing(Path(__file__).parent / "_templates", _REPO_ROOT / "templates")
STATIC_DIR = _first_existing(Path(__file__).parent / "_static", _REPO_ROOT / "static")


class InspectorConfig(AppConfig):
    name = "inspector"
    verbose_name = "Threadmill console"
    default_auto_field = "django.db.models.BigAutoField"
