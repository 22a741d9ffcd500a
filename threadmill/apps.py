from django.apps import AppConfig


class ThreadmillConfig(AppConfig):
    name = "threadmill"
    verbose_name = "Threadmill"

    def ready(self) -> None:
        # Django registers its check of every task backend (our configuration and preflight
        # checks among them) when django.tasks is first imported; `manage.py check` alone never would.
        import django.tasks  # noqa: F401
