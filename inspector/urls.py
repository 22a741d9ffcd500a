"""The console's URLs; mount with `path("threadmill/", include("inspector.urls"))`."""

from django.urls import path, register_converter

from . import cancel, converters, metrics, operate, ready, taskstats, views, workflows

register_converter(converters.BackendConverter, "tm_backend")
register_converter(converters.QueueConverter, "tm_queue")
register_converter(converters.SegmentConverter, "tm_segment")
register_converter(converters.TaskIdConverter, "tm_task_id")
register_converter(converters.WorkerConverter, "tm_worker")
register_converter(converters.WorkerCommandConverter, "tm_worker_command")
register_converter(converters.ScheduleNameConverter, "tm_schedule")
register_converter(converters.ScheduleCommandConverter, "tm_schedule_command")
register_converter(converters.TaskPathConverter, "tm_task_path")

app_name = "inspector"

urlpatterns = [
    path("", views.queue_list, name="queue_list"),
    path("workers/", views.worker_list, name="worker_list"),
    path("audit/", views.audit_list, name="audit_list"),
    path("tasks/", taskstats.task_path_list, name="task_path_list"),
    path(
        "tasks/<tm_backend:backend>/<tm_queue:queue>/<tm_task_path:path>/",
        taskstats.task_path_detail,
        name="task_path_detail",
    ),
    path("workflows/", workflows.workflow_list, name="workflow_list"),
    path("workflows/<tm_task_id:workflow_id>/", workflows.workflow_detail, name="workflow_detail"),
    path("workflows/<tm_task_id:workflow_id>/cancel/", workflows.cancel_workflow, name="cancel_workflow"),
    path("workflows/<tm_task_id:workflow_id>/retry/", workflows.retry_workflow, name="retry_workflow"),
    path("search/", views.search, name="search"),
    path("metrics", metrics.metrics, name="metrics"),
    path("ready", ready.ready, name="ready"),
    path("schedules/", operate.schedule_list, name="schedule_list"),
    path(
        "schedules/<tm_backend:backend>/<tm_schedule:name>/<tm_schedule_command:command>/",
        operate.control_schedule,
        name="control_schedule",
    ),
    path(
        "workers/<tm_backend:backend>/<tm_worker:worker>/<tm_worker_command:command>/",
        operate.command_worker,
        name="command_worker",
    ),
    path("<tm_backend:backend>/task/<tm_task_id:task_id>/", views.task_detail, name="task_detail"),
    path("<tm_backend:backend>/task/<tm_task_id:task_id>/requeue/", views.requeue_task, name="requeue_task"),
    path("<tm_backend:backend>/task/<tm_task_id:task_id>/cancel/", views.cancel_task, name="cancel_task"),
    path("<tm_backend:backend>/<tm_queue:queue>/pause/", operate.pause_queue, name="pause_queue"),
    path("<tm_backend:backend>/<tm_queue:queue>/resume/", operate.resume_queue, name="resume_queue"),
    path("<tm_backend:backend>/<tm_queue:queue>/limits/", operate.queue_limits, name="queue_limits"),
    path("<tm_backend:backend>/<tm_queue:queue>/limits/clear/", operate.clear_queue_limits, name="clear_queue_limits"),
    path(
        "<tm_backend:backend>/<tm_queue:queue>/running/requeue-orphaned/",
        operate.requeue_orphaned,
        name="requeue_orphaned",
    ),
    path("<tm_backend:backend>/<tm_queue:queue>/<tm_segment:segment>/", views.task_list, name="task_list"),
    path(
        "<tm_backend:backend>/<tm_queue:queue>/<tm_segment:segment>/requeue/", views.requeue_tasks, name="requeue_tasks"
    ),
    path("<tm_backend:backend>/<tm_queue:queue>/<tm_segment:segment>/delete/", views.delete_tasks, name="delete_tasks"),
    path(
        "<tm_backend:backend>/<tm_queue:queue>/<tm_segment:segment>/cancel/", cancel.cancel_tasks, name="cancel_tasks"
    ),
    path(
        "<tm_backend:backend>/<tm_queue:queue>/<tm_segment:segment>/purge/", views.purge_segment, name="purge_segment"
    ),
]
