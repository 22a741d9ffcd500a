from django.contrib import admin
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="inspector:queue_list")),
    # Pages outside the console (the admin's login) do not link the icon; browsers then ask here.
    path("favicon.ico", RedirectView.as_view(url=static("inspector/favicon.svg"), permanent=True)),
    path("admin/", admin.site.urls),
    path("threadmill/", include("inspector.urls")),
]
