from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from ai1net import views
from ai1net.accounts import views as accounts_views

urlpatterns = [
    path("healthz", views.healthz, name="healthz"),
    path("", accounts_views.home, name="home"),
    path("", include("ai1net.accounts.urls")),
    path("", include("devices.urls")),
    path("", include("im.urls")),
    path("", include("mobile.urls")),
    path("", include("probes.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("admin/", admin.site.urls),
]
