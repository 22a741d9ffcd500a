"""Threadmill: a Redis or Valkey backend and worker pool for Django's tasks."""

from .aborts import aborting
from .progress import TaskProgress, set_metadata, set_progress

__all__ = ["TaskProgress", "aborting", "set_metadata", "set_progress"]
