from django.apps import AppConfig


class ThreadmillConfig(AppConfig):
    name = "threadmill"
    verbose_name = "Threadmill"
