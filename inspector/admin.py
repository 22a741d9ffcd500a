"""The audit log in the admin, read-only: entries are written by console actions only."""

from django.contrib import admin

from .models import AuditEntry


@admin.register(AuditEntry)
class AuditEntryAdmin(admin.ModelAdmin):
    list_display = ("at", "username", "action", "backend", "queue_name", "segment", "count")
    list_filter = ("action", "backend", "queue_name", "segment")
    search_fields = ("username", "queue_name")

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
