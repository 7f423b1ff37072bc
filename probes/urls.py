from django.urls import path

from probes import api, views

app_name = "probes"

urlpatterns = [
    path("studio/", views.studio, name="studio"),
    path("api/probes/", api.ProbeListApi.as_view(), name="api-probes"),
    path("api/probes/approvals", api.ApprovalsApi.as_view(), name="api-approvals"),
    path("api/probes/commands/<uuid:command_id>", api.CommandDetailApi.as_view(), name="api-command"),
    path("api/probes/commands/<uuid:command_id>/approve", api.CommandApproveApi.as_view(), name="api-approve"),
    path("api/probes/commands/<uuid:command_id>/reject", api.CommandRejectApi.as_view(), name="api-reject"),
    path("api/probes/<str:probe>", api.ProbeDetailApi.as_view(), name="api-probe"),
    path("api/probes/<str:probe>/commands", api.ProbeCommandsApi.as_view(), name="api-probe-commands"),
]
