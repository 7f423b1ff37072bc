from django.contrib import admin
from django.contrib.staticfiles.views import serve as static_serve
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from ai1net import views
from ai1net.accounts import views as accounts_views

urlpatterns = [
    path("healthz", views.healthz, name="healthz"),
    path("downloads/<str:name>", views.download_client, name="download-client"),
    path("", accounts_views.home, name="home"),
    path("", include("ai1net.accounts.urls")),
    path("", include("devices.urls")),
    path("", include("im.urls")),
    path("", include("mobile.urls")),
    path("", include("probes.urls")),
    path("", include("notify.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("admin/", admin.site.urls),
    # daphne serves no files itself: the pages' small CSS/JS come from the finders (no collectstatic step).
    re_path(r"^static/(?P<path>.+)$", static_serve, {"insecure": True}),
]
